"""What a sandbox container looks like: image, limits, network, environment, and the sidecars beside it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from terminus_env.utils.limits import (
    MAX_CPUS,
    MAX_LIFETIME_S,
    MAX_MEMORY_MB,
    MAX_PIDS,
    MAX_STORAGE_MB,
    MIN_CPUS,
    MIN_MEMORY_MB,
    MIN_PIDS,
    MIN_STORAGE_MB,
)
from terminus_env.utils.sidecars import Services

DEFAULT_CPUS = 1.0
DEFAULT_MEMORY_MB = 2048
DEFAULT_STORAGE_MB = 10240
"""Used when a task sets no ``storage_mb``: Terminal-Bench 2 tasks typically ask for 10 GiB."""
# Docker's default set minus NET_RAW, MKNOD, AUDIT_WRITE, SYS_CHROOT, SETFCAP and SETPCAP:
# enough for chown, package managers (setuid/setgid), kill and binding low ports.
CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "SETUID", "SETGID", "KILL", "NET_BIND_SERVICE")
LOG_LIMIT = {"max-size": "1m", "max-file": "1"}  # a container's log: its programs can write to it at will
DAEMON_CAPABILITIES = ("SYS_ADMIN", "SYS_CHROOT", "SETPCAP", "NET_ADMIN", "LINUX_IMMUTABLE")
"""Added to the container for its main process and control daemon alone, which need them to split the container,
to enter the agent's namespaces, to cut the container off the host and to hold the root folder still while the
verifier runs; every other process in the container runs without them (see inside/seccomp.py)."""


@dataclass(frozen=True)
class SandboxSpec:
    """One episode's container; hashable, so a pool can keep warm containers per spec."""

    image: str
    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    pids_limit: int = 1024
    allow_internet: bool = False
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str | None = None
    lifetime_s: float = 4 * 3600
    """How long the container lives, counted from its start: then it ends, whatever runs in it."""
    life_needed_s: float | None = None
    """How much of its lifetime a sandbox must have left to be handed out for an episode (the agent's and the
    verifier's limits, with a margin): a warm pool removes an older one instead. None: half of ``lifetime_s``."""
    user: str | None = None  # the terminal's and exec's default user; None: the image's USER
    capabilities: tuple[str, ...] = CAPABILITIES
    shm_size_mb: int | None = None  # None: Docker's 64 MB
    tmpfs: tuple[tuple[str, str], ...] = ()
    """(path, mount options) pairs, mounted empty in the container; their writes count against its memory."""
    extra_hosts: tuple[tuple[str, str], ...] = ()
    """(host name, address) pairs added to /etc/hosts."""
    services: Services | None = None
    """Sidecars to start first, on a network of the episode's own that the container joins."""

    def __post_init__(self) -> None:
        if not self.image:
            raise ValueError("SandboxSpec.image is empty: name the image to run")
        _check_range("cpus", self.cpus, MIN_CPUS, MAX_CPUS, f"or None for {DEFAULT_CPUS}")
        _check_range("memory_mb", self.memory_mb, MIN_MEMORY_MB, MAX_MEMORY_MB, f"or None for {DEFAULT_MEMORY_MB}")
        _check_range("storage_mb", self.storage_mb, MIN_STORAGE_MB, MAX_STORAGE_MB, f"or None for {DEFAULT_STORAGE_MB}")
        _check_range("lifetime_s", self.lifetime_s, 1, MAX_LIFETIME_S, "")
        _check_range("life_needed_s", self.life_needed_s, 0, self.lifetime_s, "(lifetime_s), or None for its half")
        _check_range("pids_limit", self.pids_limit, MIN_PIDS, MAX_PIDS, "")
        _check_range("shm_size_mb", self.shm_size_mb, 1, MAX_MEMORY_MB, "or None for Docker's default")
        object.__setattr__(self, "env", MappingProxyType({str(k): str(v) for k, v in self.env.items()}))

    def __hash__(self) -> int:
        return hash(self._key())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SandboxSpec) and self._key() == other._key()

    def _key(self) -> tuple:
        return (
            self.image, self.effective_cpus, self.effective_memory_mb, self.effective_storage_mb, self.pids_limit,
            self.allow_internet, tuple(sorted(self.env.items())), self.workdir, self.lifetime_s,
            self.effective_life_needed_s, self.user,
            self.capabilities, self.shm_size_mb, self.tmpfs, self.extra_hosts, self.services,
        )  # fmt: skip

    @property
    def effective_cpus(self) -> float:
        return DEFAULT_CPUS if self.cpus is None else float(self.cpus)

    @property
    def effective_memory_mb(self) -> int:
        return DEFAULT_MEMORY_MB if self.memory_mb is None else int(self.memory_mb)

    @property
    def effective_storage_mb(self) -> int:
        return DEFAULT_STORAGE_MB if self.storage_mb is None else int(self.storage_mb)

    @property
    def effective_life_needed_s(self) -> float:
        return self.lifetime_s / 2 if self.life_needed_s is None else float(self.life_needed_s)


def _check_range(name: str, value: float | None, low: float, high: float, hint: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"SandboxSpec.{name}={value!r} must be a number between {low:g} and {high:g} {hint}".strip())
    if not low <= value <= high:
        raise ValueError(f"SandboxSpec.{name}={value!r} must be between {low:g} and {high:g} {hint}".strip())
