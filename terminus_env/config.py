"""The one place where terminus-env reads environment variables.

Everything else takes its configuration as arguments; callers that want the
environment's say pass ``environ=os.environ`` (the default) through here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from terminus_env.errors import TerminusError

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class ConfigError(TerminusError, ValueError):
    """An environment variable holds a value terminus-env cannot use."""


def env_flag(name: str, default: bool, environ: Mapping[str, str] | None = None) -> bool:
    """Read a 0/1/true/false variable; anything else is an error naming the variable."""
    environ = os.environ if environ is None else environ
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean: set it to 0, 1, true or false")


def env_str(name: str, default: str | None = None, environ: Mapping[str, str] | None = None) -> str | None:
    environ = os.environ if environ is None else environ
    raw = environ.get(name)
    return default if raw is None or raw == "" else raw


def host_environment(environ: Mapping[str, str] | None = None) -> Mapping[str, str]:
    """All of the host's variables: tasks name their own in templates (``${VAR}`` in ``[environment.env]`` and in
    compose files), resolved from here as Harbor and Docker Compose resolve them."""
    return dict(os.environ if environ is None else environ)


@dataclass(frozen=True)
class Variable:
    """One environment variable the package reads: the documentation's configuration page is made from these."""

    name: str
    values: str
    """What it may hold."""
    default: str
    """What applies when it is unset or empty."""
    meaning: str


STRICT_FORMAT = "SWE_STRICT_FORMAT"
STRICT_TRUNCATION = "SWE_STRICT_TRUNCATION"
EVAL_STRICT_FORMAT = "SWE_EVAL_STRICT_FORMAT"
EVAL_STRICT_TRUNCATION = "SWE_EVAL_STRICT_TRUNCATION"
BASE_IMAGE = "TERMINUS_BASE_IMAGE"
DEBIAN_MIRROR = "TERMINUS_DEBIAN_MIRROR"
BUILDER = "TERMINUS_BUILDER"
SANDBOX_CHANNEL = "TERMINUS_SANDBOX_CHANNEL"
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"

VARIABLES: tuple[Variable, ...] = (
    Variable(STRICT_FORMAT, "0, 1, true, false", "1",
             "train mode: a reply the parser rejects ends the episode with reward 0, ungraded (`format_error`); "
             "0 gives the agent the parser's feedback and a next turn instead"),
    Variable(STRICT_TRUNCATION, "0, 1, true, false", "1",
             "train mode: a reply that fills the turn's token limit ends the episode with reward 0, ungraded "
             "(`turn_truncated`); 0 salvages its commands up to `</response>`"),
    Variable(EVAL_STRICT_FORMAT, "0, 1, true, false", "0",
             "eval mode (and `terminus-env eval`): as `SWE_STRICT_FORMAT`, lenient by default so that scores "
             "compare with public Terminal-Bench results"),
    Variable(EVAL_STRICT_TRUNCATION, "0, 1, true, false", "0", "eval mode: as `SWE_STRICT_TRUNCATION`"),
    Variable(BASE_IMAGE, "an image reference", "`terminus-env/base:bookworm`",
             "the base image the shipped tasks build FROM, made locally with debootstrap (`terminus-env images "
             "base`)"),
    Variable(DEBIAN_MIRROR, "a URL", "`http://deb.debian.org/debian`",
             "the Debian mirror the base image is made from and its containers install from"),
    Variable(BUILDER, "auto, buildkit, classic", "auto",
             "which builder builds task images: BuildKit where the engine has it, else the classic builder"),
    Variable(SANDBOX_CHANNEL, "auto, direct, relay", "auto",
             "how the host reaches a sandbox's control daemon: direct, a unix socket in a folder shared with the "
             "engine's containers (a local engine); relay, one long-lived `docker exec` per container (any engine)"),
    Variable(CUDA_VISIBLE_DEVICES, "GPU indices, comma-separated", "every GPU",
             "which GPUs `terminus-env serve` hands out to its replicas"),
)
"""Every variable the package reads, in the order the configuration page lists them."""
