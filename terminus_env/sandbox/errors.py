"""Typed errors of the sandbox; each message says what to do next."""

from __future__ import annotations

from terminus_env.errors import TerminusError


class SandboxError(TerminusError):
    """Base class for every failure of a sandbox, its images or its terminal."""


class DockerUnavailable(SandboxError):
    """No Docker engine answers at the configured address."""

    def __init__(self, detail: str) -> None:
        super().__init__(
            f"no Docker engine answers ({detail}). Start one, e.g. `apt-get install docker.io && dockerd &`, "
            "or point DOCKER_HOST at a running engine, then retry."
        )


class ImageBuildError(SandboxError):
    """Building an image failed; carries the tail of the build log."""

    def __init__(self, name: str, reason: str, log_tail: str = "") -> None:
        self.name = name
        self.log_tail = log_tail
        message = f"building the image for {name!r} failed: {reason}"
        if log_tail:
            message += f"\n--- last lines of the build log ---\n{log_tail}"
        super().__init__(message)


class TerminalGone(SandboxError):
    """The shell in tmux exited (e.g. after `exit`) or the container died; start a new sandbox."""
