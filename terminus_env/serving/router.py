"""Which replica serves a rollout: sticky sessions, least-loaded placement of new ones.

A rollout's turns share a growing prefix, so after its first request it stays on one replica (its
KV and prefix cache live there). Only the placement of a *new* session is a choice, and the policies
differ in what "least loaded" means. With ``capacity = num_gpu_blocks × block_size`` tokens (from
``vllm:cache_config_info``) and ``kv_cache_usage = 1 - free/(num_gpu_blocks - 1)`` where vLLM's *free*
already includes evictable cached blocks, a replica's load (lower wins) is:

- ``requests``: in-flight requests + live sessions between turns, from the router's own counts. An
  agent session has one request at a time, so this is the number of live sticky sessions.
- ``active_kv``: live KV footprint / capacity = ``(kv_cache_usage × capacity + prompt tokens
  dispatched since the last scrape) / capacity``. It counts only blocks pinned by running requests.
- ``available_kv`` (the default): ``1 - (available - reserved) / capacity`` where ``available = (free +
  evictable cached blocks) × block_size = (1 - kv_cache_usage) × capacity`` and ``reserved`` is what
  the router expects its sessions on that replica to claim soon: the traces of sessions waiting on a
  tool (their KV is evictable now but they will pin it again), one expected turn of growth per live
  session, and prompts dispatched since the last scrape. Note that ``1 - evictable_ratio`` is not the
  active utilisation when free blocks are counted apart; here free and evictable both count as
  available, and the sessions' own claims on the evictable part are subtracted explicitly.

Baselines: ``round_robin`` (sticky), ``least_requests`` (sticky, in-flight requests acquired on
dispatch and released on completion, as verl does), ``vllm_internal`` (``waiting × 4 + running``,
not sticky) and ``consistent_hash`` (rendezvous hash of the session id; sticky by construction).

The expected growth per turn is a running average of how much a session's trace grew between its
turns (``turn_growth_prior_tokens`` until the first is seen). With ``group_affinity``, a new session
whose GRPO siblings are live goes where most of them are, while that replica's load is within
``group_slack`` of the best (a fraction of capacity for the KV policies; ``max(1, slack × best)``
sessions for the count policies): siblings share a prompt prefix, but often also a task's length.

Metrics older than ``metrics_max_age_s`` make a replica count as saturated for the metric policies:
it gets new sessions only when every replica is stale, and then the router's own counts decide.
Ties are broken by a rendezvous hash of the session id, so placement is deterministic.
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from terminus_env.serving.metrics import EngineMetrics

POLICIES = (
    "requests", "active_kv", "available_kv", "round_robin", "least_requests", "vllm_internal", "consistent_hash",
)
_METRIC_POLICIES = frozenset({"active_kv", "available_kv", "vllm_internal"})
_KV_POLICIES = frozenset({"active_kv", "available_kv"})
_SATURATED = math.inf


class NoReplicaAvailable(RuntimeError):
    """Every replica is marked down; nothing can be placed until one comes back (``mark_up``)."""


class UnknownReplica(KeyError):
    """A replica name the router was not built with."""


@dataclass
class _Replica:
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


@dataclass
class _Session:
    replica: str | None  # None until placed, and always for the non-sticky policy
    group: str | None
    key: int  # rendezvous-hash seed from the session id
    trace_tokens: int = 0
    inflight: int = 0
    turns_here: int = 0  # turns completed on its current replica, for the rebalancing cooldown
    unscraped: dict[str, tuple[int, int]] = field(default_factory=dict)  # replica -> (epoch, prompt tokens)


class Router:
    """Sticky, least-loaded placement of sessions on replicas. Not thread-safe; one event loop owns it."""

    def __init__(
        self,
        replicas: Sequence[str],
        policy: str = "available_kv",
        *,
        group_affinity: bool = False,
        metrics_max_age_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        turn_growth_prior_tokens: int = 1024,
        group_slack: float = 0.1,
        rebalance: bool = False,
        rebalance_load: float = 1.0,
        rebalance_margin: float = 0.25,
        rebalance_after_turns: int = 3,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown routing policy {policy!r}; choose one of {', '.join(POLICIES)}")
        if not replicas:
            raise ValueError("a Router needs at least one replica")
        if len(set(replicas)) != len(replicas):
            raise ValueError(f"replica names must be unique, got {list(replicas)}")
        self.policy = policy
        self.group_affinity = group_affinity
        self.metrics_max_age_s = metrics_max_age_s
        self.group_slack = group_slack
        if rebalance and policy == "vllm_internal":
            raise ValueError("rebalance moves sticky sessions; vllm_internal places every request afresh")
        self.rebalance = rebalance
        self.rebalance_load = rebalance_load
        self.rebalance_margin = rebalance_margin
        self.rebalance_after_turns = rebalance_after_turns
        self.migrations = 0
        self._clock = clock
        self._replicas = {name: _Replica(name, i) for i, name in enumerate(replicas)}
        self._order = list(self._replicas.values())
        self._sessions: dict[str, _Session] = {}
        self._groups: dict[str, dict[str, int]] = {}  # group id -> replica -> live sessions there
        self._turn_growth = float(turn_growth_prior_tokens)
        self._rr_next = 0
        self._loads = {
            "requests": self._loads_requests,
            "least_requests": self._loads_inflight,
            "active_kv": self._loads_active_kv,
            "available_kv": self._loads_available_kv,
            "vllm_internal": self._loads_vllm_internal,
        }.get(policy)

    # -- placement -----------------------------------------------------------------------------------

    def route(self, session_id: str, group_id: str | None = None) -> str:
        """The replica for this session's next request (the same one for its whole life while it is up)."""
        session = self._sessions.get(session_id)
        if session is None:
            session = _Session(None, group_id, zlib.crc32(session_id.encode()))
            self._sessions[session_id] = session
        elif session.replica is not None:
            home = self._replicas[session.replica]
            if home.up:
                moved = self._rebalanced(session, home) if self.rebalance else None
                return moved.name if moved is not None else home.name
            self._detach(session)  # its replica went down: place it afresh
        up = [r for r in self._order if r.up]
        if not up:
            raise NoReplicaAvailable("every replica is marked down; wait for a health probe to mark one up")
        chosen = self._place(session, up)
        if self.policy != "vllm_internal":
            self._attach(session, chosen)
        return chosen.name

    def _rebalanced(self, session: _Session, home: _Replica) -> _Replica | None:
        """Move a session between turns off a replica whose sessions claim more KV than it has.

        Stickiness is worth a prefix cache; a saturated replica instead preempts and recomputes its
        sessions turn after turn while others may sit idle. A session that has stayed
        ``rebalance_after_turns`` turns moves when its home's ``available_kv`` load (whatever policy
        placed it) is at least ``rebalance_load`` and another replica, charged with this session's
        trace, would still be ``rebalance_margin`` lower. The move costs one prefill of its trace on
        the new replica.
        """
        if session.inflight or session.turns_here < self.rebalance_after_turns:
            return None
        horizon = self._clock() - self.metrics_max_age_s
        home_load = self._loads_available_kv([home], horizon)[0]
        if home_load < self.rebalance_load or home_load == _SATURATED:
            return None  # the common case, in O(1)
        up = [r for r in self._order if r.up and r is not home]
        loads = self._loads_available_kv(up, horizon)
        candidates = [(load + session.trace_tokens / r.capacity, r.index, r)
                      for r, load in zip(up, loads) if load != _SATURATED and r.capacity]
        if not candidates:
            return None
        load, _, target = min(candidates)
        if load > home_load - self.rebalance_margin:
            return None
        self._detach(session)
        self._attach(session, target)
        session.turns_here = 0
        self.migrations += 1
        return target

    def _place(self, session: _Session, up: list[_Replica]) -> _Replica:
        if self.policy == "round_robin":
            chosen = up[self._rr_next % len(up)]
            self._rr_next += 1
            return chosen
        if self.policy == "consistent_hash":
            return max(up, key=lambda r: _mix(session.key, r.index))
        horizon = self._clock() - self.metrics_max_age_s  # older scrapes are stale
        loads = self._loads(up, horizon)  # type: ignore[misc]
        best = min(loads)
        if best == _SATURATED:
            loads = self._loads_requests(up, horizon)
            best = min(loads)
        if self.group_affinity and session.group is not None:
            sibling = self._sibling_replica(session.group, up, loads, best)
            if sibling is not None:
                return sibling
        tied = [r for r, load in zip(up, loads) if load <= best + 1e-12]
        return tied[0] if len(tied) == 1 else max(tied, key=lambda r: _mix(session.key, r.index))

    def _sibling_replica(self, group: str, up: list[_Replica], loads: list[float], best: float) -> _Replica | None:
        """The replica holding most of this group's live sessions, if it is within slack of the best."""
        placed = self._groups.get(group)
        if not placed:
            return None
        slack = self.group_slack if self.policy in _KV_POLICIES else max(1.0, self.group_slack * best)
        candidates = [
            (placed[r.name], -load, r)
            for r, load in zip(up, loads)
            if r.name in placed and load != _SATURATED and load <= best + slack
        ]
        if not candidates:
            return None
        return max(candidates, key=lambda c: (c[0], c[1]))[2]

    # -- loads (lower is better) ---------------------------------------------------------------------

    # Each returns one load per replica; ``horizon`` is the oldest scrape time still fresh.

    def _loads_requests(self, up: list[_Replica], horizon: float) -> list[float]:
        return [float(r.inflight + r.idle_sessions) for r in up]

    def _loads_inflight(self, up: list[_Replica], horizon: float) -> list[float]:
        return [float(r.inflight) for r in up]

    def _loads_active_kv(self, up: list[_Replica], horizon: float) -> list[float]:
        return [_kv_load(r, horizon, r.unscraped_tokens) for r in up]

    def _loads_available_kv(self, up: list[_Replica], horizon: float) -> list[float]:
        """``1 - (available - reserved) / capacity``: the same order as the module docstring's score."""
        growth = self._turn_growth
        return [_kv_load(r, horizon, r.idle_trace_tokens + growth * r.sessions + r.unscraped_tokens) for r in up]

    def _loads_vllm_internal(self, up: list[_Replica], horizon: float) -> list[float]:
        return [
            _SATURATED if r.metrics is None or r.scraped_at < horizon
            else (r.metrics.num_requests_waiting + r.unscraped_requests) * 4 + r.metrics.num_requests_running
            for r in up
        ]

    # -- bookkeeping ---------------------------------------------------------------------------------

    def _attach(self, session: _Session, r: _Replica) -> None:
        session.replica = r.name
        r.sessions += 1
        if session.inflight == 0:
            r.idle_sessions += 1
            r.idle_trace_tokens += session.trace_tokens
        if session.group is not None:
            placed = self._groups.setdefault(session.group, {})
            placed[r.name] = placed.get(r.name, 0) + 1

    def _detach(self, session: _Session) -> None:
        if session.replica is None:
            return
        r = self._replicas[session.replica]
        r.sessions -= 1
        if session.inflight == 0:
            r.idle_sessions -= 1
            r.idle_trace_tokens -= session.trace_tokens
        if session.group is not None:
            placed = self._groups[session.group]
            placed[r.name] -= 1
            if placed[r.name] == 0:
                del placed[r.name]
                if not placed:
                    del self._groups[session.group]
        session.replica = None

    def _replica(self, name: str) -> _Replica:
        try:
            return self._replicas[name]
        except KeyError:
            raise UnknownReplica(f"no replica {name!r}; this router knows {', '.join(self._replicas)}") from None

    def on_dispatch(self, replica: str, session_id: str, prompt_tokens: int) -> None:
        """A request left for ``replica``; count it until the replica's next scrape shows it."""
        r = self._replica(replica)
        r.inflight += 1
        r.unscraped_requests += 1
        r.unscraped_tokens += prompt_tokens
        session = self._sessions.get(session_id)
        if session is None:
            return
        if session.replica is not None and session.inflight == 0:
            home = self._replicas[session.replica]
            home.idle_sessions -= 1
            home.idle_trace_tokens -= session.trace_tokens
        session.inflight += 1
        session.unscraped[replica] = (r.epoch, prompt_tokens)

    def on_complete(self, replica: str, session_id: str, prompt_tokens: int, completion_tokens: int) -> None:
        """A request came back (or failed: pass ``completion_tokens=0``)."""
        r = self._replica(replica)
        r.inflight = max(0, r.inflight - 1)
        session = self._sessions.get(session_id)
        if session is None:
            return
        epoch, dispatched = session.unscraped.pop(replica, (-1, 0))
        if epoch == r.epoch:  # not in a scrape yet: take back exactly what on_dispatch counted
            r.unscraped_requests -= 1
            r.unscraped_tokens -= dispatched
        if session.inflight == 0:
            return
        session.inflight -= 1
        if completion_tokens > 0:
            trace = prompt_tokens + completion_tokens
            if session.trace_tokens > 0:
                self._turn_growth += 0.1 * ((trace - session.trace_tokens) - self._turn_growth)
            session.trace_tokens = trace
            session.turns_here += replica == session.replica
        if session.replica is not None and session.inflight == 0:
            home = self._replicas[session.replica]
            home.idle_sessions += 1
            home.idle_trace_tokens += session.trace_tokens

    def update_metrics(self, replica: str, metrics: EngineMetrics) -> None:
        """A fresh scrape; it now includes everything dispatched before it."""
        r = self._replica(replica)
        r.metrics = metrics
        r.capacity = metrics.kv_capacity_tokens or 0
        r.scraped_at = self._clock()
        r.epoch += 1
        r.unscraped_requests = 0
        r.unscraped_tokens = 0

    def mark_down(self, replica: str) -> None:
        """Take a replica out of placement; its sessions move on their next ``route``."""
        self._replica(replica).up = False

    def mark_up(self, replica: str) -> None:
        self._replica(replica).up = True

    def release(self, session_id: str) -> None:
        """The episode ended: forget the session (idempotent)."""
        session = self._sessions.pop(session_id, None)
        if session is not None:
            self._detach(session)

    # -- introspection -------------------------------------------------------------------------------

    def replica_of(self, session_id: str) -> str | None:
        session = self._sessions.get(session_id)
        return None if session is None else session.replica

    def sessions_on(self, replica: str) -> int:
        return self._replica(replica).sessions


def _kv_load(r: _Replica, horizon: float, extra_tokens: float) -> float:
    """``kv_cache_usage + extra_tokens / capacity`` from a fresh scrape; saturated without one."""
    m = r.metrics
    if m is None or r.scraped_at < horizon:
        return _SATURATED
    return m.kv_cache_usage + extra_tokens / r.capacity if r.capacity else m.kv_cache_usage


def _mix(key: int, index: int) -> int:
    """A deterministic 64-bit mix of a session key and a replica index (rendezvous hashing)."""
    x = (key * 0x9E3779B97F4A7C15 + index * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 31
    x = (x * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 29)
