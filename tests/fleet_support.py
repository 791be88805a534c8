"""A local two-node Ray cluster for the fleet tests, on this one machine.

Both nodes are processes of this machine, so both hosts share its one Docker engine: an image one host builds is
there for the other, which the tests keep in mind (locality is checked through placement, not build counts).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pytest
from require import REQUIRE_RAY

from terminus_env.config import env_flag

SLOTS = 2
"""Each node's terminus_sandbox_host amount: small, since the machine has 2 cores shared with others."""


def import_ray() -> ModuleType:
    """Ray, for a test module's top: a missing Ray skips the module, or fails it under TERMINUS_REQUIRE_RAY=1 (CI)."""
    if env_flag(REQUIRE_RAY, False):
        return importlib.import_module("ray")
    return pytest.importorskip("ray", reason="Ray is not installed: pip install 'terminus-env[ray]'")


@dataclass
class TwoNodes:
    cluster: Any  # ray.cluster_utils.Cluster
    worker: Any  # the second node, which the tests may kill and replace

    def kill_worker(self) -> None:
        """Kill the second node at once (no graceful shutdown), as a machine that dies."""
        self.cluster.remove_node(self.worker, allow_graceful=False)

    def add_worker(self) -> None:
        from terminus_env.sandbox.fleet import RESOURCE

        self.worker = self.cluster.add_node(num_cpus=1, resources={RESOURCE: SLOTS})


def two_nodes(ray: ModuleType) -> Iterator[TwoNodes]:
    """Start the head and one more node, each with 1 CPU and SLOTS slots; this process joins as the driver."""
    from ray.cluster_utils import Cluster

    from terminus_env.sandbox.fleet import RESOURCE

    args = {"num_cpus": 1, "resources": {RESOURCE: SLOTS}}
    cluster = Cluster(initialize_head=True, head_node_args={**args, "include_dashboard": False})
    try:
        nodes = TwoNodes(cluster, cluster.add_node(**args))
        ray.init(address=cluster.address, log_to_driver=False)
        yield nodes
    finally:
        ray.shutdown()
        cluster.shutdown()
