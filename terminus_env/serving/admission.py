"""How many rollouts may be in flight: a fixed cap from the capacity rule, or one that adapts.

Admission is where KV safety has to come from: once a rollout runs, its trace keeps growing and the
engine can only shed it by preempting (recomputing) someone, so the controller budgets *predicted
final* trace lengths before it lets a rollout start, and never cancels one in flight.

The controllers are synchronous and never wait: ``try_acquire`` admits or refuses, ``pick`` says
which waiter goes next, and :class:`~terminus_env.serving.scheduler.Scheduler` keeps the queue, for
the serving pool and the benchmark alike.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Mapping, Sequence

from terminus_env.serving.capacity import (
    max_rollout_concurrency,
    max_rollout_concurrency_from_metrics,
)
from terminus_env.serving.metrics import EngineMetrics


class Admission:
    """Base: counts admitted sessions against ``limit``; subclasses decide the limit."""

    def __init__(self) -> None:
        self._admitted: set[str] = set()

    @property
    def limit(self) -> int:
        raise NotImplementedError

    @property
    def in_flight(self) -> int:
        return len(self._admitted)

    def try_acquire(self, session_id: str, group_id: str | None = None) -> bool:
        """Admit now if under the limit; never waits. Re-acquiring an admitted session is an error."""
        if session_id in self._admitted:
            raise ValueError(f"session {session_id!r} is already admitted; release it before acquiring again")
        if len(self._admitted) >= self.limit:
            return False
        self._admitted.add(session_id)
        self._on_admit(session_id, group_id)
        return True

    def release(self, session_id: str, final_trace_tokens: int) -> None:
        """The rollout ended with a trace of ``final_trace_tokens`` (0 if unknown); frees its slot."""
        if session_id not in self._admitted:
            return
        self._admitted.discard(session_id)
        self._on_release(session_id, final_trace_tokens)

    def on_turn(self, session_id: str, trace_tokens: int) -> None:
        """The session's live trace after a turn (prompt + completion tokens)."""

    def on_placed(self, session_id: str, replica: str) -> None:
        """The router sent the session's request to ``replica``: told on every request; the replica
        changes only on a failover or a rebalancing move."""

    def observe(self, metrics: Mapping[str, EngineMetrics]) -> None:
        """The latest scrape of every replica."""

    def pick(self, waiting: Sequence[tuple[str, str | None]]) -> int:
        """Which of the waiting ``(session_id, group_id)``, in arrival order, to admit next: the first (FIFO)."""
        return 0

    def _on_admit(self, session_id: str, group_id: str | None) -> None:
        pass

    def _on_release(self, session_id: str, final_trace_tokens: int) -> None:
        pass


class FixedAdmission(Admission):
    """A constant cap, e.g. the seed's ``min(pipeline cap, x × DP)`` with headroom."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"an admission limit must be at least 1, got {limit}")
        super().__init__()
        self._limit = limit

    @property
    def limit(self) -> int:
        return self._limit

    @classmethod
    def from_capacity(cls, pipeline_cap: int, per_rank: float, dp: int, headroom: float = 0.9) -> FixedAdmission:
        """The capacity rule with ``x = per_rank`` traces per replica (see ``capacity.requests_per_rank``)."""
        return cls(max_rollout_concurrency(pipeline_cap, per_rank, dp, headroom))

    @classmethod
    def from_metrics(
        cls, replicas: Mapping[str, EngineMetrics], pipeline_cap: int, avg_trace_tokens: float, headroom: float = 0.9
    ) -> FixedAdmission:
        """The capacity rule over live replicas' scraped KV pools."""
        return cls(max_rollout_concurrency_from_metrics(replicas, pipeline_cap, avg_trace_tokens, headroom))


class AdaptiveAdmission(Admission):
    """A cap that budgets the predicted traces of running rollouts against the KV pool.

    On each ``observe`` it predicts every running rollout's final trace length (finished siblings of its
    group first, then finished rollouts at least as long as it is now, then ``prior_trace_tokens``),
    caps it at the trace ``horizon_turns`` turns ahead (its live trace plus the mean growth per turn
    seen so far), and charges it to the replica holding it (``on_placed``). Each replica's budget is
    ``target_usage × its scale × its KV capacity``; the limit is ``running + room // expected new
    trace`` (a new rollout's first-turn trace plus ``horizon_turns - 1`` turns of growth, at most the
    mean final trace), within ``[min_limit, pipeline_cap]``, where ``room`` is what is left on the
    replicas with room (see ``desired_limit``). The horizon is there because rollouts finish while
    others grow: budgeting every live rollout at its final length counts KV that the longest ones
    reach only after most others have left, and the live set is biased towards long rollouts, since
    they stay longer. ``horizon_turns=None`` budgets whole rollouts (hardly any preemption, but KV left
    idle). With ``longest_first``, waiters are admitted longest-predicted group first (see ``pick``).

    A replica's scale drops by ``backoff`` at once when its preemption counter rises, and after
    ``recover_after`` quiet observations climbs by ``recover_step`` per observation: back to 1.0, and on
    up to ``max_target_scale`` (overcommit) only while the limit is what holds rollouts back and that
    replica has less than ``probe_below_usage`` of its KV pinned (rollouts waiting on tools pin none).
    With the default ``max_target_scale = 1`` no budget exceeds ``target_usage`` of its replica. Moves
    smaller than ``deadband`` (a fraction of the limit) are ignored and a move must be wanted
    ``patience`` observations in a row, so one burst does not swing it; preemptions lower it at once.
    """

    def __init__(
        self,
        pipeline_cap: int,
        prior_trace_tokens: float,
        *,
        kv_capacity_tokens: int | None = None,
        target_usage: float = 0.9,
        min_limit: int = 1,
        backoff: float = 0.8,
        min_target_scale: float = 0.3,
        max_target_scale: float = 1.0,
        recover_after: int = 3,
        recover_step: float = 0.1,
        probe_below_usage: float = 0.8,
        deadband: float = 0.05,
        patience: int = 3,
        history: int = 512,
        horizon_turns: float | None = 3.0,
        longest_first: bool = True,
    ) -> None:
        if pipeline_cap < 1 or min_limit < 1 or min_limit > pipeline_cap:
            raise ValueError(f"need 1 <= min_limit ({min_limit}) <= pipeline_cap ({pipeline_cap})")
        if prior_trace_tokens <= 0:
            raise ValueError(f"prior_trace_tokens must be positive, got {prior_trace_tokens}")
        if not 0 < target_usage <= 1 or not 0 < backoff < 1 or not 0 < min_target_scale <= 1:
            raise ValueError("target_usage, backoff and min_target_scale must be fractions in (0, 1]")
        if max_target_scale < 1:
            raise ValueError(f"max_target_scale must be at least 1, got {max_target_scale}")
        if horizon_turns is not None and horizon_turns <= 0:
            raise ValueError(f"horizon_turns must be positive (or None for whole rollouts), got {horizon_turns}")
        super().__init__()
        self.pipeline_cap = pipeline_cap
        self.prior_trace_tokens = float(prior_trace_tokens)
        self.target_usage = target_usage
        self.min_limit = min_limit
        self.backoff = backoff
        self.min_target_scale = min_target_scale
        self.max_target_scale = max_target_scale
        self.recover_after = recover_after
        self.recover_step = recover_step
        self.probe_below_usage = probe_below_usage
        self.deadband = deadband
        self.patience = patience
        self.horizon_turns = horizon_turns
        self.longest_first = longest_first
        self._history = history
        self._capacity = kv_capacity_tokens
        self._capacities: dict[str, int] = {}  # replica -> KV tokens, from the latest scrape
        self._scales: dict[str, float] = {}  # replica -> backoff (< 1) or probed overcommit (> 1) on target_usage
        self._quiet: dict[str, int] = {}  # replica -> scrapes since its preemption counter last rose
        self._preemptions: dict[str, float] = {}
        self._live: dict[str, int] = {}  # session -> live trace tokens
        self._replica_of: dict[str, str] = {}  # session -> the replica that holds its KV
        self._group_of: dict[str, str | None] = {}
        self._group_finals: dict[str, list[int]] = {}
        self._live_per_group: dict[str, int] = {}
        self._admitted_per_group: dict[str, int] = {}  # siblings admitted so far, for groups seen lately
        self._finals: deque[int] = deque(maxlen=history)
        self._first_traces = _RecentMean(history)  # trace after a rollout's first turn
        self._growths = _RecentMean(history)  # trace growth between consecutive turns
        self._sorted_finals: list[int] = []
        self._suffix: list[float] | None = None
        self._pending_dir = 0
        self._pending_count = 0
        self._limit = self._initial_limit()
        self._calibrated = kv_capacity_tokens is not None

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def target_scale(self) -> float:
        """The most backed-off replica's factor on ``target_usage``: below 1 after its preemptions, above 1
        while overcommit is probed."""
        return min(self._scales.values(), default=1.0)

    # -- inputs --------------------------------------------------------------------------------------

    def _on_admit(self, session_id: str, group_id: str | None) -> None:
        self._live[session_id] = 0
        self._group_of[session_id] = group_id
        if group_id is not None:
            self._live_per_group[group_id] = self._live_per_group.get(group_id, 0) + 1
            self._admitted_per_group[group_id] = self._admitted_per_group.get(group_id, 0) + 1
            self._forget_old_groups()

    def on_turn(self, session_id: str, trace_tokens: int) -> None:
        if session_id not in self._live:
            return
        before = self._live[session_id]
        if before == 0:
            self._first_traces.append(trace_tokens)
        elif trace_tokens > before:
            self._growths.append(trace_tokens - before)
        self._live[session_id] = trace_tokens

    def on_placed(self, session_id: str, replica: str) -> None:
        if session_id in self._live:
            self._replica_of[session_id] = replica

    def replica_of(self, session_id: str) -> str | None:
        """Where a live session's KV is charged (None until placed)."""
        return self._replica_of.get(session_id)

    def _on_release(self, session_id: str, final_trace_tokens: int) -> None:
        self._live.pop(session_id, None)
        self._replica_of.pop(session_id, None)
        group = self._group_of.pop(session_id, None)
        if final_trace_tokens > 0:
            self._remember_final(final_trace_tokens)
            if group is not None:
                self._group_finals.setdefault(group, []).append(final_trace_tokens)
        if group is not None:
            self._live_per_group[group] -= 1
            if self._live_per_group[group] == 0:  # siblings may still be waiting: keep its finals a while
                del self._live_per_group[group]

    def _forget_old_groups(self) -> None:
        """Keep what is known of at most ``history`` groups, dropping the oldest with nothing live."""
        for memory in (self._admitted_per_group, self._group_finals):
            if len(memory) > self._history:
                for group in [g for g in memory if g not in self._live_per_group][: len(memory) - self._history]:
                    del memory[group]

    def observe(self, metrics: Mapping[str, EngineMetrics]) -> None:
        capacities = {name: m.kv_capacity_tokens for name, m in metrics.items()}
        if capacities and all(c is not None for c in capacities.values()):
            self._capacities = {name: c for name, c in capacities.items() if c is not None}
            self._capacity = sum(self._capacities.values())
        binding = self.in_flight >= self._limit
        preempted = [self._adjust_scale(name, m, binding) for name, m in metrics.items()]
        if not self._calibrated and self._capacity is not None:
            self._limit, self._calibrated = self.desired_limit(), True  # the first real figure: take it
        else:
            self._update_limit(self.desired_limit(), urgent=any(preempted))

    def _adjust_scale(self, name: str, m: EngineMetrics, binding: bool) -> bool:
        """Back a replica's budget off at once when its preemption counter rose; else let it creep back
        to 1.0, and past it (overcommit) only while the limit is what holds rollouts back and the
        replica's pinned KV says there is room (rollouts waiting on tools pin none). True if it rose."""
        before = self._preemptions.get(name)
        self._preemptions[name] = m.num_preemptions_total
        scale = self._scales.get(name, 1.0)
        if before is not None and m.num_preemptions_total > before:
            self._scales[name] = max(self.min_target_scale, scale * self.backoff)
            self._quiet[name] = 0
            return True
        self._quiet[name] = quiet = self._quiet.get(name, 0) + 1
        probing = binding and m.kv_cache_usage < self.probe_below_usage
        ceiling = self.max_target_scale if probing else 1.0
        if quiet >= self.recover_after and scale < ceiling:
            self._scales[name] = min(ceiling, scale + self.recover_step)
        return False

    # -- the decision --------------------------------------------------------------------------------

    def pick(self, waiting: Sequence[tuple[str, str | None]]) -> int:
        """FIFO, or with ``longest_first`` the waiter whose group is predicted longest.

        A group's prediction is the larger of its finished siblings' mean final trace and its longest
        live sibling's trace so far (siblings share a task, so their lengths correlate); a group nobody
        has started yet gets the mean final trace (the prior until rollouts finish). Among equals, the group
        with fewest siblings admitted goes first, so every group starts one rollout early and reveals its
        length: longest-processing-time
        first, the classic makespan heuristic, with lengths learnt from siblings.
        """
        if not self.longest_first or len(waiting) < 2:
            return 0
        live_max: dict[str, int] = {}
        for session, trace in self._live.items():
            group = self._group_of.get(session)
            if group is not None and trace > live_max.get(group, 0):
                live_max[group] = trace
        prior = self._mean_final()

        def key(i: int) -> tuple[float, int, int]:
            group = waiting[i][1]
            if group is None:
                return (-prior, 0, i)
            finals = self._group_finals.get(group)
            known = [sum(finals) / len(finals)] if finals else []
            if group in live_max:
                known.append(live_max[group])
            return (-(max(known) if known else prior), self._admitted_per_group.get(group, 0), i)

        return min(range(len(waiting)), key=key)

    def predict_final(self, session_id: str) -> float:
        """Expected final trace tokens of a running rollout."""
        now = self._live.get(session_id, 0)
        group = self._group_of.get(session_id)
        siblings = [f for f in self._group_finals.get(group, ()) if f >= now] if group is not None else []
        if siblings:
            return sum(siblings) / len(siblings)
        if self._sorted_finals:
            i = bisect.bisect_left(self._sorted_finals, now)
            if i < len(self._sorted_finals):
                return self._suffix_sums()[i] / (len(self._sorted_finals) - i)
            return now * 1.25  # longer than anything seen: expect it to keep growing a while
        return max(self.prior_trace_tokens, now * 1.25)

    def expected_new_trace(self) -> float:
        """What a rollout admitted now is budgeted: its final trace, or its trace after the horizon."""
        final = self._mean_final()
        if self.horizon_turns is None or not self._first_traces.count:
            return final
        return min(final, self._first_traces.mean + self._turn_growth() * (self.horizon_turns - 1))

    def _mean_final(self) -> float:
        return sum(self._finals) / len(self._finals) if self._finals else self.prior_trace_tokens

    def predict_within_horizon(self, session_id: str) -> float:
        """A running rollout's trace ``horizon_turns`` turns from now, never past its predicted final."""
        final = self.predict_final(session_id)
        if self.horizon_turns is None:
            return final
        return min(final, self._live.get(session_id, 0) + self._turn_growth() * self.horizon_turns)

    def _turn_growth(self) -> float:
        """Mean trace growth per turn seen so far (tool output plus the next answer)."""
        if self._growths.count:
            return self._growths.mean
        return self.prior_trace_tokens  # nothing seen yet: as cautious as the whole-rollout budget

    def desired_limit(self) -> int:
        """What the limit would be now, before deadband and patience.

        Each replica's budget is ``target × its scale × its KV capacity`` (its scale backs off on its
        own preemptions), charged with the predictions of the sessions placed on it (``on_placed``);
        what is left on the replicas with room, less the predictions of sessions not placed yet, is
        what new rollouts may take. A replica over its budget does not hold back admission onto an idle
        one, since the router places new sessions where there is room; one pooled budget let two
        overloaded replicas hold the limit at 1 for 90 s while a third sat empty (bench seed 0).
        """
        if self._capacity is None:
            return self._limit
        pools = self._capacities or {"": self._capacity}
        committed = dict.fromkeys(pools, 0.0)
        unplaced = 0.0
        for session in self._live:
            replica = self._replica_of.get(session)
            prediction = self.predict_within_horizon(session)
            if replica in committed:
                committed[replica] += prediction
            else:
                unplaced += prediction
        free = [self.target_usage * self._scales.get(name, 1.0) * capacity - committed[name]
                for name, capacity in pools.items()]
        new = self.expected_new_trace()
        with_room = sum(f for f in free if f > 0) - unplaced
        # Where no replica has room for a new rollout, the deficit counts too: the limit then falls below
        # the rollouts in flight, so one finishing on an overloaded replica does not let another start.
        room = math.floor((with_room if with_room >= new else sum(free) - unplaced) / new)
        return max(self.min_limit, min(self.pipeline_cap, len(self._live) + room))

    def _initial_limit(self) -> int:
        if self._capacity is None:
            return self.min_limit  # nothing known yet: the first observe() sets it
        room = math.floor(self.target_usage * self._capacity / self.prior_trace_tokens)
        return max(self.min_limit, min(self.pipeline_cap, room))

    def _update_limit(self, desired: int, urgent: bool) -> None:
        if urgent and desired < self._limit:
            self._limit = desired
            self._pending_count = 0
            return
        if abs(desired - self._limit) <= max(1, self.deadband * self._limit):
            self._pending_count = 0
            return
        direction = 1 if desired > self._limit else -1
        if direction != self._pending_dir:
            self._pending_dir, self._pending_count = direction, 0
        self._pending_count += 1
        if self._pending_count >= self.patience:
            self._limit = desired
            self._pending_count = 0

    def _suffix_sums(self) -> list[float]:
        """``sums[i] = sum(sorted finals[i:])``, rebuilt only after a rollout finished."""
        if self._suffix is None:
            sums = [0.0] * (len(self._sorted_finals) + 1)
            for i in range(len(self._sorted_finals) - 1, -1, -1):
                sums[i] = sums[i + 1] + self._sorted_finals[i]
            self._suffix = sums
        return self._suffix

    def _remember_final(self, tokens: int) -> None:
        self._suffix = None
        if len(self._finals) == self._finals.maxlen:
            old = self._finals[0]
            del self._sorted_finals[bisect.bisect_left(self._sorted_finals, old)]
        self._finals.append(tokens)
        bisect.insort(self._sorted_finals, tokens)


class _RecentMean:
    """The mean of the last ``size`` values, kept up to date in O(1) per value."""

    def __init__(self, size: int) -> None:
        self._values: deque[int] = deque(maxlen=size)
        self._sum = 0

    def append(self, value: int) -> None:
        if len(self._values) == self._values.maxlen:
            self._sum -= self._values[0]
        self._values.append(value)
        self._sum += value

    @property
    def count(self) -> int:
        return len(self._values)

    @property
    def mean(self) -> float:
        return self._sum / len(self._values) if self._values else 0.0
