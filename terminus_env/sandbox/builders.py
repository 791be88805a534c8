"""Which builder builds an image (BuildKit, else the classic one), and what a failed build's message says.

Task authors write Dockerfiles for BuildKit, Docker's default builder since 23.0: ``COPY a b .`` with no trailing
``/``, ``RUN --mount=type=cache``. The classic builder refuses both, so it is only the fallback: for an engine
without BuildKit, or when ``TERMINUS_BUILDER=classic`` asks for it. Pure rules; the builds are in ``images``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from terminus_env import config
from terminus_env.config import ConfigError
from terminus_env.sandbox.buildkit import engine_has_buildkit


class Builder(str, Enum):
    BUILDKIT = "buildkit"
    CLASSIC = "classic"


class BuilderSetting(str, Enum):
    """``TERMINUS_BUILDER``: ``auto`` (BuildKit where the engine has it), ``buildkit`` or ``classic``."""

    AUTO = "auto"
    BUILDKIT = "buildkit"
    CLASSIC = "classic"


@dataclass(frozen=True)
class BuilderChoice:
    builder: Builder
    why: str = ""
    """Why the classic builder builds, for its error messages; empty for BuildKit."""


_HEREDOC = re.compile(r"(?m)^\s*(?:RUN|COPY|ADD)\b[^\n]*<<-?\s*[\"']?[A-Za-z_][A-Za-z0-9_]*")
_PARSE_ERROR = re.compile(r"dockerfile parse error|unknown instruction", re.IGNORECASE)
_SYNTAX_LINE = re.compile(r"(?im)\A(?:\s*#[^\n]*\n)*?\s*#\s*syntax\s*=")
_FRONTEND_FETCH = re.compile(r"frontend gateway|docker/dockerfile|failed to resolve source metadata", re.IGNORECASE)
_BUILDKIT_ONLY = re.compile(
    r"destination must be a directory and end with a /|--mount|unknown flag: (?:mount|chmod|link)", re.IGNORECASE
)


def builder_setting(environ: Mapping[str, str] | None = None) -> BuilderSetting:
    raw = (config.env_str(config.BUILDER, BuilderSetting.AUTO.value, environ) or "").strip().lower()
    try:
        return BuilderSetting(raw)
    except ValueError:
        choices = ", ".join(setting.value for setting in BuilderSetting)
        raise ConfigError(f"{config.BUILDER}={raw!r} names no builder: set it to one of {choices}") from None


def choose_builder(setting: BuilderSetting, engine_version: Mapping[str, Any]) -> BuilderChoice:
    """BuildKit where the engine has it (unless the setting says classic); the classic builder otherwise.
    Raises ConfigError when the setting asks for BuildKit and the engine has none."""
    if setting is BuilderSetting.CLASSIC:
        return BuilderChoice(Builder.CLASSIC, f"{config.BUILDER}=classic asks for it")
    has_buildkit, why_not = engine_has_buildkit(engine_version)
    if has_buildkit:
        return BuilderChoice(Builder.BUILDKIT)
    if setting is BuilderSetting.BUILDKIT:
        raise ConfigError(f"{config.BUILDER}=buildkit, but this engine has no BuildKit: {why_not}; unset it")
    return BuilderChoice(Builder.CLASSIC, f"this engine has no BuildKit: {why_not}")


def failure_reason(choice: BuilderChoice, error: str, dockerfile: str, engine: str) -> str:
    """What a failed build's error says: which builder failed, why that one built, the engine's error, and what
    to do when the cause is a known gap between the builders (``engine`` is the engine's version, for the text)."""
    if choice.builder is Builder.BUILDKIT:
        reason = f"BuildKit (the engine's own, Docker {engine}) failed: {error}"
        frontend_missing = bool(_SYNTAX_LINE.search(dockerfile) and _FRONTEND_FETCH.search(error))
        if frontend_missing:
            reason += (
                ". The Dockerfile's `# syntax=` line asks for a frontend image, which could not be had (no registry "
                "answers here?): drop the line to build with the engine's own frontend, or load that image locally"
            )
        if (frontend_missing or _PARSE_ERROR.search(error)) and _HEREDOC.search(dockerfile):
            reason += (
                ". The Dockerfile uses a heredoc (`RUN <<EOF`), which needs Dockerfile syntax 1.4 or newer; this "
                "engine's own BuildKit reads an older one, and a `# syntax=docker/dockerfile:1.4` line fetches a "
                "newer one only where a registry answers. Otherwise put the script in a file in the build context "
                "and COPY it"
            )
        return reason
    reason = f"the classic builder ({choice.why}) failed: {error}"
    if _BUILDKIT_ONLY.search(error) or (_PARSE_ERROR.search(error) and _HEREDOC.search(dockerfile)):
        reason += (
            ". This Dockerfile is written for BuildKit (a multi-file COPY into a folder without a trailing /, "
            "RUN --mount, heredocs), which the classic builder does not read: build on an engine with BuildKit "
            f"(Docker 18.09 or newer, Linux containers), or unset {config.BUILDER}"
        )
    return reason
