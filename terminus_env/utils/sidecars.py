"""Sidecars: the containers a task's compose file runs beside the agent's, in a typed form.

The loader reads compose files into these records (``terminus_env.tasks.compose``) and the sandbox starts them
(``terminus_env.sandbox.services``); this module holds only the records, with no Docker in it, so loading tasks
never imports Docker. Every field is a tuple or a scalar, so a record is hashable, like the sandbox spec that
carries it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path


class Condition(str, Enum):
    """What a service waits for in a service it depends on (compose's ``depends_on`` conditions)."""

    STARTED = "service_started"
    HEALTHY = "service_healthy"
    COMPLETED = "service_completed_successfully"


@dataclass(frozen=True)
class Dependency:
    service: str
    condition: Condition = Condition.STARTED


@dataclass(frozen=True)
class Healthcheck:
    """Docker's health check: ``test`` in Docker's form (``("CMD", ...)``, ``("CMD-SHELL", "...")``, ``("NONE",)``)."""

    test: tuple[str, ...]
    interval_s: float = 30.0
    timeout_s: float = 30.0
    retries: int = 3
    start_period_s: float = 0.0


@dataclass(frozen=True)
class Build:
    """An image to build: a folder, its Dockerfile (relative to it) and build arguments."""

    context: Path
    dockerfile: str = "Dockerfile"
    args: tuple[tuple[str, str], ...] = ()
    timeout_s: float = 600.0
    name: str = "sidecar"
    """What its image is tagged after (``terminus-env/task-<name>:<hash>``)."""


@dataclass(frozen=True)
class Sidecar:
    """One service beside the agent's container, reachable by ``name`` (and ``aliases``) on the episode's network.

    Limits left at None take the sandbox's defaults for a container.
    """

    name: str
    image: str | None = None
    """Used as it is: present locally, or pulled. None: built from ``build``."""
    build: Build | None = None
    command: tuple[str, ...] | None = None
    entrypoint: tuple[str, ...] | None = None
    env: tuple[tuple[str, str], ...] = ()
    workdir: str | None = None
    user: str | None = None
    aliases: tuple[str, ...] = ()
    shm_size_mb: int | None = None
    tmpfs: tuple[tuple[str, str], ...] = ()
    """(path, mount options) pairs; options may be empty."""
    extra_hosts: tuple[tuple[str, str], ...] = ()
    cpus: float | None = None
    memory_mb: int | None = None
    pids_limit: int | None = None
    healthcheck: Healthcheck | None = None
    depends_on: tuple[Dependency, ...] = ()
    cap_add: tuple[str, ...] = ()
    init: bool = False

    @property
    def label(self) -> str:
        """How messages name it."""
        return f"service {self.name!r}"


@dataclass(frozen=True)
class Services:
    """The sidecars of an episode, and how its main container (the agent's) joins them."""

    sidecars: tuple[Sidecar, ...]
    main_name: str = "main"
    """The main container's name on the episode's network (Harbor's ``main``, Terminal-Bench 1's ``client``)."""
    main_aliases: tuple[str, ...] = ()
    main_depends_on: tuple[Dependency, ...] = ()
    """What must hold before the main container starts (its ENTRYPOINT may use the services at once)."""

    def __post_init__(self) -> None:
        names = {sidecar.name for sidecar in self.sidecars}
        owners = [(self.main_name, self.main_depends_on), *((s.name, s.depends_on) for s in self.sidecars)]
        for owner, dependencies in owners:
            unknown = [d.service for d in dependencies if d.service not in names]
            if unknown:
                raise ValueError(f"{owner!r} depends on {', '.join(map(repr, unknown))}, which is no sidecar here")

    def start_order(self) -> tuple[Sidecar, ...]:
        """The sidecars with every one after those it depends on (the loader has refused cycles)."""
        by_name = {sidecar.name: sidecar for sidecar in self.sidecars}
        ordered: list[Sidecar] = []
        placed: set[str] = set()

        def place(sidecar: Sidecar) -> None:
            if sidecar.name in placed:
                return
            placed.add(sidecar.name)
            for dependency in sidecar.depends_on:
                place(by_name[dependency.service])
            ordered.append(sidecar)

        for sidecar in self.sidecars:
            place(sidecar)
        return tuple(ordered)
