"""Where a new session goes: one object per placement rule, all behind one interface.

The :class:`~terminus_env.serving.router.Router` keeps sessions sticky and keeps each replica's counts
and last scrape in a :class:`ReplicaState`; a policy only answers which of the replicas that are up
takes a new session (or, for a policy that is not sticky, every request). With ``capacity =
num_gpu_blocks × block_size`` tokens and ``kv_cache_usage = 1 - free/(num_gpu_blocks - 1)``, where
vLLM's *free* already includes evictable cached blocks, a replica's load (lower wins) is:

- ``requests``: in-flight requests + live sessions between turns, from the router's own counts. An
  agent session has one request at a time, so this is the number of live sticky sessions.
- ``least_requests``: in-flight requests only (verl's acquire/release), sticky.
- ``active_kv``: ``kv_cache_usage + prompt tokens dispatched since the last scrape / capacity``: KV
  pinned by running requests.
- ``available_kv`` (the default): ``1 - (available - reserved) / capacity`` where ``available = (1 -
  kv_cache_usage) × capacity`` counts free and evictable blocks and ``reserved`` is what the router
  expects its sessions there to claim soon: the traces of sessions waiting on a tool (evictable now,
  pinned again at their next turn), one expected turn of growth per live session, and prompts
  dispatched since the last scrape.
- ``vllm_internal``: ``waiting × 4 + running`` from the scrape, not sticky (vLLM's own DP balancing).
- ``round_robin`` (sticky) and ``consistent_hash`` (rendezvous hash of the session id) ignore load.

The load policies share :class:`LeastLoaded`: metrics older than the router's freshness horizon make
a replica count as saturated; when every replica is, the router's own counts decide; with
``group_affinity`` a new session goes where most of its live GRPO siblings are while that replica is
within ``group_slack`` of the best; ties go by a rendezvous hash, so placement is deterministic.
A policy object may keep state (``round_robin``'s turn), so each router gets its own.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from terminus_env.serving.metrics import EngineMetrics

SATURATED = math.inf


@dataclass
class ReplicaState:
    """The router's view of one replica: its last scrape and the router's own counts since."""

    name: str
    index: int
    up: bool = True
    metrics: EngineMetrics | None = None
    capacity: int = 0  # KV tokens from the last scrape; 0 when the server does not say
    scraped_at: float = -math.inf
    epoch: int = 0  # bumped by each scrape: dispatches from an older epoch are already in the metrics
    sessions: int = 0
    inflight: int = 0
    idle_sessions: int = 0
    idle_trace_tokens: int = 0
    unscraped_requests: int = 0
    unscraped_tokens: int = 0


@dataclass(frozen=True)
class Placement:
    """What a policy may know about the session being placed, besides the replicas' states."""

    session_key: int  # a stable hash of the session id, for rendezvous hashing and tie-breaks
    siblings: Mapping[str, int]  # replica -> live sessions of the same GRPO group there
    fresh_since: float  # the oldest scrape time still fresh
    turn_growth: float  # the router's running mean of trace growth per turn, in tokens


class Policy(ABC):
    """Chooses the replica for a new session among those that are up (never an empty list)."""

    name: ClassVar[str]
    sticky: ClassVar[bool] = True  # False: every request is placed afresh and never attached

    @abstractmethod
    def choose(self, up: Sequence[ReplicaState], placement: Placement) -> ReplicaState: ...


class LeastLoaded(Policy):
    """The replica with the lowest :meth:`loads`, with saturation fallback, group affinity and hashed ties."""

    kv_units: ClassVar[bool] = False  # loads are KV fractions (slack is absolute) rather than counts

    def __init__(self, *, group_affinity: bool = False, group_slack: float = 0.1) -> None:
        if group_slack < 0:
            raise ValueError(f"group_slack must be >= 0, got {group_slack}")
        self.group_affinity = group_affinity
        self.group_slack = group_slack

    @abstractmethod
    def loads(self, up: Sequence[ReplicaState], placement: Placement) -> list[float]:
        """One load per replica, lower is better; :data:`SATURATED` where the policy cannot tell."""

    def choose(self, up: Sequence[ReplicaState], placement: Placement) -> ReplicaState:
        loads = self.loads(up, placement)
        best = min(loads)
        if best == SATURATED:  # nothing fresh anywhere: the router's own counts decide
            loads = session_counts(up)
            best = min(loads)
        if self.group_affinity and placement.siblings:
            sibling = self._sibling_replica(up, loads, best, placement.siblings)
            if sibling is not None:
                return sibling
        tied = [r for r, load in zip(up, loads) if load <= best + 1e-12]
        return tied[0] if len(tied) == 1 else max(tied, key=lambda r: mix(placement.session_key, r.index))

    def _sibling_replica(
        self, up: Sequence[ReplicaState], loads: list[float], best: float, siblings: Mapping[str, int]
    ) -> ReplicaState | None:
        """The replica holding most of this group's live sessions, if it is within slack of the best."""
        slack = self.group_slack if self.kv_units else max(1.0, self.group_slack * best)
        candidates = [
            (siblings[r.name], -load, r)
            for r, load in zip(up, loads)
            if r.name in siblings and load != SATURATED and load <= best + slack
        ]
        if not candidates:
            return None
        return max(candidates, key=lambda c: (c[0], c[1]))[2]


class Requests(LeastLoaded):
    name = "requests"

    def loads(self, up: Sequence[ReplicaState], placement: Placement) -> list[float]:
        return session_counts(up)


class LeastRequests(LeastLoaded):
    name = "least_requests"

    def loads(self, up: Sequence[ReplicaState], placement: Placement) -> list[float]:
        return [float(r.inflight) for r in up]


class ActiveKV(LeastLoaded):
    name = "active_kv"
    kv_units = True

    def loads(self, up: Sequence[ReplicaState], placement: Placement) -> list[float]:
        return [kv_load(r, placement.fresh_since, r.unscraped_tokens) for r in up]


class AvailableKV(LeastLoaded):
    name = "available_kv"
    kv_units = True

    def loads(self, up: Sequence[ReplicaState], placement: Placement) -> list[float]:
        return available_kv_loads(up, placement.fresh_since, placement.turn_growth)


class VllmInternal(LeastLoaded):
    name = "vllm_internal"
    sticky = False

    def loads(self, up: Sequence[ReplicaState], placement: Placement) -> list[float]:
        return [
            SATURATED if r.metrics is None or r.scraped_at < placement.fresh_since
            else (r.metrics.num_requests_waiting + r.unscraped_requests) * 4 + r.metrics.num_requests_running
            for r in up
        ]


class RoundRobin(Policy):
    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, up: Sequence[ReplicaState], placement: Placement) -> ReplicaState:
        chosen = up[self._next % len(up)]
        self._next += 1
        return chosen


class ConsistentHash(Policy):
    name = "consistent_hash"

    def choose(self, up: Sequence[ReplicaState], placement: Placement) -> ReplicaState:
        return max(up, key=lambda r: mix(placement.session_key, r.index))


_BY_NAME: dict[str, type[Policy]] = {
    cls.name: cls
    for cls in (Requests, ActiveKV, AvailableKV, RoundRobin, LeastRequests, VllmInternal, ConsistentHash)
}
POLICIES = tuple(_BY_NAME)


def make_policy(name: str, *, group_affinity: bool = False, group_slack: float = 0.1) -> Policy:
    """A fresh policy object by name; ``group_*`` apply to the load policies only."""
    cls = _BY_NAME.get(name)
    if cls is None:
        raise ValueError(f"unknown routing policy {name!r}; choose one of {', '.join(POLICIES)}")
    if issubclass(cls, LeastLoaded):
        return cls(group_affinity=group_affinity, group_slack=group_slack)
    return cls()


def session_counts(up: Sequence[ReplicaState]) -> list[float]:
    return [float(r.inflight + r.idle_sessions) for r in up]


def available_kv_loads(up: Sequence[ReplicaState], fresh_since: float, turn_growth: float) -> list[float]:
    """``1 - (available - reserved) / capacity`` per replica: the module docstring's score."""
    return [kv_load(r, fresh_since, r.idle_trace_tokens + turn_growth * r.sessions + r.unscraped_tokens) for r in up]


def kv_load(r: ReplicaState, fresh_since: float, extra_tokens: float) -> float:
    """``kv_cache_usage + extra_tokens / capacity`` from a fresh scrape; saturated without one."""
    m = r.metrics
    if m is None or r.scraped_at < fresh_since:
        return SATURATED
    return m.kv_cache_usage + extra_tokens / r.capacity if r.capacity else m.kv_cache_usage


def mix(key: int, index: int) -> int:
    """A deterministic 64-bit mix of a session key and a replica index (rendezvous hashing)."""
    x = (key * 0x9E3779B97F4A7C15 + index * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 31
    x = (x * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 29)
