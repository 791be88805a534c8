"""terminus-env: terminal tasks as a Gymnasium environment, spoken to in the Terminus 2 protocol.

Importing the package registers ``terminus_env/Terminus-v0``. For ``gymnasium.make_vec`` with
``vectorization_mode="async"``, pass ``vector_kwargs={"shared_memory": False}``: Text spaces do not
fit shared memory. For many rollouts, ``terminus_env.rollout.RolloutRunner`` is the fast path.

The public names load on first use, so ``import terminus_env.serving`` does not pull in Docker.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import gymnasium as _gymnasium

if TYPE_CHECKING:
    from terminus_env.env import Reply, TerminusEnv  # noqa: F401 - loaded lazily by __getattr__
    from terminus_env.protocol import Strictness, parse_reply  # noqa: F401
    from terminus_env.tasks import load_task, load_tasks  # noqa: F401

# The one place the version is written: the build reads it from here (pyproject.toml, [tool.hatch.version]),
# `terminus-env --version` prints it, and CHANGELOG.md names it.
__version__ = "0.1.0"
ENV_ID = "terminus_env/Terminus-v0"

_PUBLIC = {
    "Reply": "terminus_env.env",
    "TerminusEnv": "terminus_env.env",
    "Strictness": "terminus_env.protocol",
    "parse_reply": "terminus_env.protocol",
    "load_task": "terminus_env.tasks",
    "load_tasks": "terminus_env.tasks",
}
__all__ = ["ENV_ID", *_PUBLIC]

if ENV_ID not in _gymnasium.registry:
    _gymnasium.register(id=ENV_ID, entry_point="terminus_env.env:TerminusEnv", nondeterministic=True)


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'terminus_env' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
