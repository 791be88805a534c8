"""Removing sandbox containers and episode networks whose owner process is gone (SIGKILL included)."""

from __future__ import annotations

import docker

from terminus_env.sandbox.channel import reap_folders
from terminus_env.sandbox.cleanup import remove_container, remove_network
from terminus_env.sandbox.docker_client import connect
from terminus_env.sandbox.owner import LABEL, Owner


def reap(include_live_owners: bool = False, client: docker.DockerClient | None = None) -> int:
    """Remove sandbox containers (sidecars included) of dead owners (of every owner with ``include_live_owners``),
    then their episode networks and channel folders; returns how many containers it removed."""
    client = connect(client)
    removed = 0
    for summary in client.api.containers(all=True, filters={"label": LABEL}):
        owner = Owner.from_labels(summary.get("Labels") or {})
        exited = summary.get("State") in ("exited", "dead")
        if include_live_owners or exited or owner is None or not owner.alive():
            removed += remove_container(client, summary["Id"])
    for network in client.api.networks(filters={"label": LABEL}):
        owner = Owner.from_labels(network.get("Labels") or {})
        if include_live_owners or owner is None or not owner.alive():
            remove_network(client, network["Name"], wait_s=0)
    reap_folders()
    return removed
