"""Sandboxes on the nodes of a Ray cluster (the optional extra ``[ray]``): a host actor per node, and
:class:`RaySandboxPool`, which ``TerminusEnv``, ``RolloutRunner`` and ``terminus-env eval --ray`` take in place of a
local :class:`~terminus_env.sandbox.SandboxPool`."""

try:
    import ray  # noqa: F401 - checked here, so a missing extra fails with the line that installs it
except ImportError as exc:  # pragma: no cover - the extra is installed wherever the tests run
    raise ImportError("sandboxes on a Ray cluster need Ray: pip install 'terminus-env[ray]'") from exc

from terminus_env.sandbox.fleet.placement import HostLimits, HostLoad, host_slots, place
from terminus_env.sandbox.fleet.pool import RESOURCE, FleetConfig, RaySandboxPool
from terminus_env.sandbox.fleet.remote import RemoteSandbox

__all__ = [
    "RESOURCE",
    "FleetConfig",
    "HostLimits",
    "HostLoad",
    "RaySandboxPool",
    "RemoteSandbox",
    "host_slots",
    "place",
]
