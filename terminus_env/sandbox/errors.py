"""Typed errors of the sandbox; each message says what to do next.

They also say whose fault a failure was, which decides whether a trainer may mask the episode:
:class:`AgentCaused` failures came from what the agent did inside the sandbox (they are the agent's failure and
must never be masked); every other :class:`SandboxError` is a fault of the infrastructure.
"""

from __future__ import annotations

from typing import ClassVar

from terminus_env.errors import TerminusError
from terminus_env.rules import Failure


class SandboxError(TerminusError):
    """Base class for every failure of a sandbox, its images or its terminal; infrastructure unless a subclass
    says otherwise."""

    shows: ClassVar[Failure] = Failure.INFRASTRUCTURE
    """What this error shows about whose fault the failure was (``rules.failure_shown`` weighs it)."""


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


class SandboxLost(SandboxError):
    """The container or its control daemon went away (removed, stopped, the engine failed); start a new sandbox."""


class AgentCaused(SandboxError):
    """The sandbox stopped working because of what the agent did in it; the episode is the agent's failure."""

    shows: ClassVar[Failure] = Failure.AGENT_BROKE


class TerminalGone(AgentCaused):
    """The agent's shell or its tmux server is gone (``exit``, Ctrl-D, ``kill -9 -1``, ``tmux kill-server``)."""

    shows: ClassVar[Failure] = Failure.TERMINAL_LOST


class BrokenByAgent(AgentCaused):
    """What the agent did to the container made a request impossible: it removed or replaced a program, a user or a
    folder that the request needs (the verifier's shell, root's entry, the verifier's private folders)."""


class DaemonFailed(AgentCaused):
    """A request to the sandbox's daemon failed and nothing explains why. The agent's processes share the container
    and may have made the state that broke it, and the host cannot prove otherwise, so it counts as the agent's (fail
    closed: otherwise any input that trips the daemon would turn a 0 into a masked episode). The message carries the
    daemon's own words, so a bug of ours shows in the episode's ``error``. A failure before the agent's first turn
    ends no episode: ``reset`` raises it, and the runner masks the rollout."""


class DaemonUnanswered(AgentCaused):
    """The sandbox's daemon did not answer a request within its bound, in a container that ran unpaused. The agent's
    processes share the daemon's CPU and hold what it waits on (the terminal's tmux server, which one ``kill -STOP``
    stalls), and the host cannot prove another cause, so it counts as the agent's (fail closed: otherwise stalling
    one's own terminal would turn any 0 into a masked episode). A paused container, or an engine that no longer
    answers, is the infrastructure's: the request then raises a plain :class:`SandboxError`."""


class ResourcesExhausted(AgentCaused):
    """Nothing more could start in the sandbox: the agent's processes used up its pids or memory."""

    shows: ClassVar[Failure] = Failure.AGENT_LIMIT


class DiskLimitExceeded(AgentCaused):
    """The agent wrote more than the task's ``storage_mb`` into the container, filled it where the engine enforces
    the limit itself, or made its writable layer impossible to measure (``used_mb`` None, ``unmeasured`` says why),
    which counts as over the limit: otherwise it could grow without end."""

    shows: ClassVar[Failure] = Failure.AGENT_LIMIT

    def __init__(self, used_mb: float | None, limit_mb: int, unmeasured: str = "") -> None:
        self.used_mb = used_mb
        self.limit_mb = limit_mb
        self.unmeasured = unmeasured
        if used_mb is None:
            message = (
                f"the sandbox's writable layer could not be measured ({unmeasured}), which counts as past the task's "
                f"storage limit of {limit_mb} MB; the agent's processes were stopped (where this process can read "
                "Docker's data root, as root beside a local engine, it walks the layer instead of asking Docker)"
            )
        else:
            message = (
                f"the sandbox's writable layer reached {used_mb:.0f} MB, and the task's storage limit is {limit_mb} "
                "MB; the agent's processes were stopped"
            )
        super().__init__(message)


def error_kinds() -> dict[str, type[SandboxError]]:
    """Every sandbox error class by name, found from :class:`SandboxError` itself, so a class added later is known
    to the Ray fleet's wire format without being listed (a missing one would cross as the infrastructure's fault)."""
    found: dict[str, type[SandboxError]] = {}
    todo: list[type[SandboxError]] = [SandboxError]
    while todo:
        cls = todo.pop()
        known = found.get(cls.__name__)
        if known is None or (_ours(cls) and not _ours(known)):  # a stray class of the same name never shadows ours
            found[cls.__name__] = cls
        todo.extend(cls.__subclasses__())
    return found


def _ours(cls: type) -> bool:
    return cls.__module__.startswith("terminus_env.")
