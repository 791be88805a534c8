"""The one place where terminus-env reads environment variables.

Everything else takes its configuration as arguments; callers that want the
environment's say pass ``environ=os.environ`` (the default) through here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

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


# Names of every variable the package reads, so docs and tests can list them.
STRICT_FORMAT = "SWE_STRICT_FORMAT"
STRICT_TRUNCATION = "SWE_STRICT_TRUNCATION"
EVAL_STRICT_FORMAT = "SWE_EVAL_STRICT_FORMAT"
EVAL_STRICT_TRUNCATION = "SWE_EVAL_STRICT_TRUNCATION"
REQUIRE_DOCKER = "TERMINUS_REQUIRE_DOCKER"
REQUIRE_RAY = "TERMINUS_REQUIRE_RAY"  # tests: a missing Ray fails the fleet tests instead of skipping them
REQUIRE_BROWSER = "TERMINUS_REQUIRE_BROWSER"  # tests: a missing chromium fails the page tests instead of skipping them
BASE_IMAGE = "TERMINUS_BASE_IMAGE"
DEBIAN_MIRROR = "TERMINUS_DEBIAN_MIRROR"
BUILDER = "TERMINUS_BUILDER"  # which builder builds images: auto (BuildKit where the engine has it), buildkit, classic
SANDBOX_CHANNEL = "TERMINUS_SANDBOX_CHANNEL"  # how the host reaches a sandbox's daemon: auto, direct, relay
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"  # which GPUs `terminus-env serve` may hand out
