"""What a sandbox container looks like: image, limits, network, environment."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

DEFAULT_CPUS = 1.0
DEFAULT_MEMORY_MB = 2048
# Docker's default set minus NET_RAW, MKNOD, AUDIT_WRITE, SYS_CHROOT, SETFCAP and SETPCAP:
# enough for chown, package managers (setuid/setgid), kill and binding low ports.
CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "SETUID", "SETGID", "KILL", "NET_BIND_SERVICE")


@dataclass(frozen=True)
class SandboxSpec:
    """One episode's container; hashable, so a pool can keep warm containers per spec."""

    image: str
    cpus: float | None = None
    memory_mb: int | None = None
    pids_limit: int = 1024
    allow_internet: bool = False
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str | None = None
    lifetime_s: float = 4 * 3600
    user: str | None = None  # the terminal's and exec's default user; None: the image's USER
    capabilities: tuple[str, ...] = CAPABILITIES

    def __post_init__(self) -> None:
        if not self.image:
            raise ValueError("SandboxSpec.image is empty: name the image to run")
        if self.cpus is not None and self.cpus <= 0:
            raise ValueError(f"SandboxSpec.cpus={self.cpus} must be positive (or None for {DEFAULT_CPUS})")
        if self.memory_mb is not None and self.memory_mb < 16:
            raise ValueError(f"SandboxSpec.memory_mb={self.memory_mb} is too small: give at least 16 MB")
        if self.lifetime_s <= 0:
            raise ValueError("SandboxSpec.lifetime_s must be positive")
        object.__setattr__(self, "env", MappingProxyType({str(k): str(v) for k, v in self.env.items()}))

    def __hash__(self) -> int:
        return hash(self._key())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SandboxSpec) and self._key() == other._key()

    def _key(self) -> tuple:
        return (
            self.image, self.effective_cpus, self.effective_memory_mb, self.pids_limit, self.allow_internet,
            tuple(sorted(self.env.items())), self.workdir, self.lifetime_s, self.user, self.capabilities,
        )  # fmt: skip

    @property
    def effective_cpus(self) -> float:
        return DEFAULT_CPUS if self.cpus is None else float(self.cpus)

    @property
    def effective_memory_mb(self) -> int:
        return DEFAULT_MEMORY_MB if self.memory_mb is None else int(self.memory_mb)
