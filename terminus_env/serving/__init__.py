"""Serving rollouts from vLLM replicas: a pool with sticky routing, admission and failover.

The public names load on first use, so importing one submodule (the simulator, the parser) does
not pull in the HTTP client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what type checkers see of the lazy names below (the package ships py.typed)
    from terminus_env.serving.client import (  # noqa: F401
        Completion,
        ContextLengthExceeded,
        EngineDied,
        ReplicaClient,
        ReplicaUnavailable,
        ServingError,
    )
    from terminus_env.serving.metrics import EngineMetrics, parse_metrics  # noqa: F401
    from terminus_env.serving.pool import ServingPool  # noqa: F401

_EXPORTS = {
    "ServingPool": "terminus_env.serving.pool",
    "Completion": "terminus_env.serving.client",
    "ServingError": "terminus_env.serving.client",
    "ContextLengthExceeded": "terminus_env.serving.client",
    "EngineDied": "terminus_env.serving.client",
    "ReplicaUnavailable": "terminus_env.serving.client",
    "ReplicaClient": "terminus_env.serving.client",
    "EngineMetrics": "terminus_env.serving.metrics",
    "parse_metrics": "terminus_env.serving.metrics",
}
__all__ = [
    "Completion",
    "ContextLengthExceeded",
    "EngineDied",
    "EngineMetrics",
    "ReplicaClient",
    "ReplicaUnavailable",
    "ServingError",
    "ServingPool",
    "parse_metrics",
]


def __getattr__(name: str) -> object:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'terminus_env.serving' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
