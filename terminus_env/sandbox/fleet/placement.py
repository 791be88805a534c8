"""Where a new sandbox goes: the pure rules of the fleet's placement, no Ray and no I/O.

A host has slots (from the node's cores and memory, the ``terminus_sandbox_host`` amount the node offers, and a
per-host limit). A new sandbox goes to a host with a free slot; among those, to one that already has the task's
image (so an image is built once per host, not once per episode); among equals, to the least loaded (spreading).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class HostLimits:
    """How many sandboxes one host may hold: the smallest of the four bounds below.

    Sandboxes mostly wait for the model, so a slot is much less than a task's own ``cpus`` and ``memory_mb``
    limits (which Docker enforces per container); docs/notes/fleet.md has the figures behind the defaults.
    """

    sandboxes_per_cpu: float = 4.0
    memory_mb_per_sandbox: int = 512
    max_sandboxes: int = 256
    """One host actor is one Python process. An idle sandbox costs it about 0.3 ms of CPU per second (the disk
    watch's walk) and a step about 4 ms, so at a step per 10 s one core serves well over 256; the bound is there so
    that one host's loss costs at most this many episodes (docs/notes/fleet.md)."""

    def __post_init__(self) -> None:
        if not self.sandboxes_per_cpu > 0:
            raise ValueError(f"HostLimits.sandboxes_per_cpu must be positive, got {self.sandboxes_per_cpu}")
        if self.memory_mb_per_sandbox <= 0:
            raise ValueError(f"HostLimits.memory_mb_per_sandbox must be positive, got {self.memory_mb_per_sandbox}")
        if self.max_sandboxes <= 0:
            raise ValueError(f"HostLimits.max_sandboxes must be positive, got {self.max_sandboxes}")


def host_slots(offered: float, cpus: float, memory_mb: float, limits: HostLimits) -> int:
    """A host's slots: what its node offers (the resource's amount), capped by its cores, memory and the limit."""
    by_cpu = math.floor(cpus * limits.sandboxes_per_cpu)
    by_memory = math.floor(memory_mb / limits.memory_mb_per_sandbox)
    return max(0, min(math.floor(offered), by_cpu, by_memory, limits.max_sandboxes))


@dataclass
class HostLoad:
    """The pool's view of one host: its slots, the sandboxes it holds, and the images it has or is building."""

    slots: int
    used: int = 0
    images: set[str] = field(default_factory=set)

    @property
    def free(self) -> int:
        return self.slots - self.used


def place(hosts: Sequence[HostLoad], image: str) -> int | None:
    """The index of the host for a new sandbox of ``image``, or None when no host has a free slot.

    A host with the image beats one without; then the lower share of slots in use; then more free slots;
    then the lower index.
    """
    best: int | None = None
    best_key: tuple[bool, float, int] | None = None
    for index, host in enumerate(hosts):
        free = host.slots - host.used
        if free <= 0:
            continue
        key = (image not in host.images, host.used / host.slots, -free)
        if best_key is None or key < best_key:
            best, best_key = index, key
    return best
