"""Which replica serves a rollout: sticky sessions, and a placement policy for new ones.

A rollout's turns share a growing prefix, so after its first request it stays on one replica (its
KV and prefix cache live there). Only the placement of a *new* session is a choice; the rules are
:mod:`terminus_env.serving.policies` objects (``available_kv`` by default). The router keeps the
counts they read: sessions, requests in flight, the traces of sessions waiting on a tool, prompts
dispatched since the last scrape, and a running mean of trace growth per turn
(``turn_growth_prior_tokens`` until the first is seen). With ``rebalance``, a session may also move
between turns off a saturated replica (see ``Router._rebalanced``).
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from terminus_env.serving.metrics import EngineMetrics
from terminus_env.serving.policies import (
    POLICIES,
    SATURATED,
    Placement,
    Policy,
    ReplicaState,
    available_kv_loads,
    make_policy,
)

__all__ = ["POLICIES", "NoReplicaAvailable", "Router", "UnknownReplica"]


class NoReplicaAvailable(RuntimeError):
    """Every replica is marked down; nothing can be placed until one comes back (``mark_up``)."""


class UnknownReplica(KeyError):
    """A replica name the router was not built with."""


@dataclass
class _Session:
    replica: str | None  # None until placed, and always under a policy that is not sticky
    group: str | None
    key: int  # rendezvous-hash seed from the session id
    trace_tokens: int = 0
    inflight: int = 0
    turns_here: int = 0  # turns completed on its current replica, for the rebalancing cooldown
    unscraped: dict[str, tuple[int, int]] = field(default_factory=dict)  # replica -> (epoch, prompt tokens)


class Router:
    """Sticky placement of sessions on replicas by a :class:`Policy`. Not thread-safe; one event loop owns it.

    ``policy`` is a name from :data:`POLICIES` (``group_affinity`` and ``group_slack`` then configure
    it) or a policy object of one's own.
    """

    def __init__(
        self,
        replicas: Sequence[str],
        policy: str | Policy = "available_kv",
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
        if not replicas:
            raise ValueError("a Router needs at least one replica")
        if len(set(replicas)) != len(replicas):
            raise ValueError(f"replica names must be unique, got {list(replicas)}")
        if isinstance(policy, str):
            policy = make_policy(policy, group_affinity=group_affinity, group_slack=group_slack)
        if rebalance and not policy.sticky:
            raise ValueError(f"rebalance moves sticky sessions; {policy.name} places every request afresh")
        self.policy = policy
        self.metrics_max_age_s = metrics_max_age_s
        self.rebalance = rebalance
        self.rebalance_load = rebalance_load
        self.rebalance_margin = rebalance_margin
        self.rebalance_after_turns = rebalance_after_turns
        self.migrations = 0
        self._clock = clock
        self._replicas = {name: ReplicaState(name, i) for i, name in enumerate(replicas)}
        self._order = list(self._replicas.values())
        self._sessions: dict[str, _Session] = {}
        self._groups: dict[str, dict[str, int]] = {}  # group id -> replica -> live sessions there
        self._turn_growth = float(turn_growth_prior_tokens)

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
        siblings = self._groups.get(session.group, {}) if session.group is not None else {}
        chosen = self.policy.choose(up, Placement(session.key, siblings, self._fresh_since(), self._turn_growth))
        if self.policy.sticky:
            self._attach(session, chosen)
        return chosen.name

    def _fresh_since(self) -> float:
        return self._clock() - self.metrics_max_age_s

    def _rebalanced(self, session: _Session, home: ReplicaState) -> ReplicaState | None:
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
        fresh_since = self._fresh_since()
        home_load = available_kv_loads([home], fresh_since, self._turn_growth)[0]
        if home_load < self.rebalance_load or home_load == SATURATED:
            return None  # the common case, in O(1)
        up = [r for r in self._order if r.up and r is not home]
        loads = available_kv_loads(up, fresh_since, self._turn_growth)
        candidates = [(load + session.trace_tokens / r.capacity, r.index, r)
                      for r, load in zip(up, loads) if load != SATURATED and r.capacity]
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

    # -- bookkeeping ---------------------------------------------------------------------------------

    def _attach(self, session: _Session, r: ReplicaState) -> None:
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

    def _replica(self, name: str) -> ReplicaState:
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
