"""A virtual-time cluster: several SimReplicas served through the production Scheduler in one event loop.

The benchmark needs hours of serving per policy in seconds of CPU, with routing and admission decided
exactly as in ``ServingPool``: the cluster drives the same :class:`Scheduler` (``submit`` / ``place`` /
``dispatched`` / ``completed`` / ``end``, and ``scraped`` / ``observe`` every ``scrape_interval_s`` of
virtual time, the first scrape before any rollout starts, as ``ServingPool.start`` does). Training
steps are released as whole batches: step ``s`` is released once steps ``0..s-K`` have all finished
(``K = max_async_steps``; the trainer consumes steps in order), so with ``K = 1`` a step starts when
the previous one has fully finished and with ``K >= 2`` the next steps' rollouts start while the
previous step's stragglers still run. Released rollouts ask for admission in plan order, and the
admission controller picks among all waiters, as the pool's queue does for the rollout runner.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from routing_lab.workload import RolloutPlan, fits
from terminus_env.serving.scheduler import Scheduler
from terminus_env.serving.sim.engine import (
    SimConfig,
    SimFinished,
    SimReplica,
    SimRequest,
)


class ClusterStalled(RuntimeError):
    """The event loop ran dry with rollouts unfinished (an admission limit that never opens, a lost request)."""


@dataclass(frozen=True)
class ClusterConfig:
    num_replicas: int = 4
    engine: SimConfig = field(default_factory=SimConfig)
    scrape_interval_s: float = 1.0
    max_async_steps: int = 1

    def __post_init__(self) -> None:
        if self.num_replicas < 1 or self.max_async_steps < 1 or self.scrape_interval_s <= 0:
            raise ValueError("ClusterConfig needs num_replicas >= 1, max_async_steps >= 1, scrape_interval_s > 0")


@dataclass(frozen=True)
class ClusterResult:
    batch_makespans_s: tuple[float, ...]
    batch_starts_s: tuple[float, ...]  # when each step's rollouts were released
    makespan_s: float
    rollouts: int
    finished_rollouts: int
    context_limited: int  # rollouts ended because prompt + max_tokens would overrun max_model_len (HTTP 400)
    requests: int
    output_tokens: int  # as the client saw them
    engine_generation_tokens: int  # as the engines counted them (must equal output_tokens)
    preemptions: int
    recomputed_tokens: int
    prefix_queries: int
    prefix_hits: int
    followup_turns: int
    stayed_turns: int  # follow-up turns served by the replica that served the previous turn
    kv_spread: float  # mean over busy scrapes of max - min kv_cache_usage across replicas
    limit_min: int  # the admission limit, sampled at every scrape
    limit_max: int
    ttft_p50_s: float
    ttft_p99_s: float

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.makespan_s if self.makespan_s else 0.0

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    @property
    def stay_share(self) -> float:
        return self.stayed_turns / self.followup_turns if self.followup_turns else 1.0

    @property
    def preemption_rate(self) -> float:
        return self.preemptions / self.requests if self.requests else 0.0


@dataclass
class _Rollout:
    plan: RolloutPlan
    prompt: tuple[int, ...]
    turn: int = 0
    replica: str | None = None
    trace: int = 0


@dataclass
class _Tally:
    requests: int = 0
    output_tokens: int = 0
    followups: int = 0
    stayed: int = 0
    context_limited: int = 0
    finished: int = 0
    ttfts: list[float] = field(default_factory=list)
    spreads: list[float] = field(default_factory=list)
    limits: list[int] = field(default_factory=list)


class Cluster:
    """Owns the virtual clock; build the Scheduler's Router with ``clock=cluster.clock`` and hand it to ``run``."""

    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self.now = 0.0
        self.replica_names = [str(i) for i in range(config.num_replicas)]
        self._replicas = {name: SimReplica(config.engine, engine=name) for name in self.replica_names}

    def clock(self) -> float:
        return self.now

    def run(self, batches: Sequence[Sequence[RolloutPlan]], scheduler: Scheduler) -> ClusterResult:
        """Serve every batch to completion and summarise. A Cluster runs once."""
        if self.now != 0.0:
            raise RuntimeError("a Cluster runs once; build a new one for the next run")
        if scheduler.admission is None:
            raise ValueError("the cluster needs an admission controller (FixedAdmission(pipeline cap) for none)")
        return _Run(self, batches, scheduler).go()


class _Run:
    """One run's mutable state: the event heap and the tallies (the admission queue is the Scheduler's)."""

    def __init__(self, cluster: Cluster, batches: Sequence[Sequence[RolloutPlan]], scheduler: Scheduler) -> None:
        self.cluster = cluster
        self.replicas = cluster._replicas
        self.batches = batches
        self.scheduler = scheduler
        self.admission = scheduler.admission
        self.events: list[tuple[float, int, str, object]] = []
        self.seq = itertools.count()
        self.busy: set[str] = set()
        self.inflight: dict[str, _Rollout] = {}  # request id -> rollout
        self.left_in_batch = [len(b) for b in batches]
        self.batch_start = [0.0] * len(batches)
        self.batch_end = [0.0] * len(batches)
        self.released = 0
        self.done_batches = 0
        self.tally = _Tally()

    def push(self, t: float, kind: str, payload: object = None) -> None:
        heapq.heappush(self.events, (t, next(self.seq), kind, payload))

    def go(self) -> ClusterResult:
        self.scrape()
        self.release_batches()
        while self.events and self.done_batches < len(self.batches):
            t, _, kind, payload = heapq.heappop(self.events)
            self.cluster.now = t
            if kind == "boundary":
                self.on_boundary(payload)  # type: ignore[arg-type]
            elif kind == "turn":
                self.send_turn(payload)  # type: ignore[arg-type]
            else:
                self.scrape()
        if self.done_batches < len(self.batches):
            raise ClusterStalled(f"{sum(self.left_in_batch)} rollouts never finished; admission limit "
                                 f"{self.admission.limit}, {self.admission.in_flight} admitted")
        return self.summary()

    # -- rollouts ------------------------------------------------------------------------------------

    def release_batches(self) -> None:
        allowed = self.done_batches + self.cluster.config.max_async_steps
        while self.released < min(allowed, len(self.batches)):
            self.batch_start[self.released] = self.cluster.now
            batch = self.batches[self.released]
            self.released += 1
            for plan in batch:
                ro = _Rollout(plan, plan.prompt)
                if self.scheduler.submit(plan.rollout_id, plan.group_id, lambda ro=ro: self.send_turn(ro)):
                    self.send_turn(ro)

    def send_turn(self, ro: _Rollout) -> None:
        plan = ro.plan
        name = self.scheduler.place(plan.rollout_id, plan.group_id)
        if ro.turn > 0:
            self.tally.followups += 1
            self.tally.stayed += name == ro.replica
        ro.replica = name
        replica = self.replicas[name]
        turn = plan.turns[ro.turn]
        req = SimRequest(f"{plan.rollout_id}/t{ro.turn}", ro.prompt, plan.max_tokens, turn.output_len,
                         output_token_ids=turn.output_token_ids)
        if not fits(len(ro.prompt), plan.max_tokens, replica.config.max_model_len):
            self.tally.context_limited += 1
            self.end_rollout(ro)
            return
        if name not in self.busy:
            replica.advance_to(self.cluster.now)
        replica.submit(req, arrival_s=self.cluster.now)
        self.scheduler.dispatched(name, plan.rollout_id, len(ro.prompt))
        self.inflight[req.request_id] = ro
        self.tally.requests += 1
        if name not in self.busy:
            self.busy.add(name)
            self.step(name)

    def on_finished(self, ro: _Rollout, done: SimFinished) -> None:
        plan = ro.plan
        self.scheduler.completed(ro.replica or "", plan.rollout_id, len(ro.prompt), done.output_tokens)
        self.tally.output_tokens += done.output_tokens
        self.tally.ttfts.append(done.ttft_s)
        ro.trace = len(ro.prompt) + done.output_tokens
        turn = plan.turns[ro.turn]
        if ro.turn + 1 == len(plan.turns):
            self.end_rollout(ro)
            return
        ro.prompt = ro.prompt + done.output_token_ids + turn.tool_tokens
        ro.turn += 1
        self.push(self.cluster.now + turn.tool_wait_s, "turn", ro)

    def end_rollout(self, ro: _Rollout) -> None:
        self.scheduler.end(ro.plan.rollout_id, ro.trace)  # first, as the rollout's session closes before its step
        self.tally.finished += 1
        step = ro.plan.step
        self.left_in_batch[step] -= 1
        if self.left_in_batch[step] == 0:
            self.batch_end[step] = self.cluster.now
            while self.done_batches < len(self.batches) and self.left_in_batch[self.done_batches] == 0:
                self.done_batches += 1
            self.release_batches()

    # -- engines -------------------------------------------------------------------------------------

    def step(self, name: str) -> None:
        replica = self.replicas[name]
        if replica.step() == 0.0:
            raise ClusterStalled(f"engine {name} has queued work but cannot schedule any of it")
        self.push(replica.now, "boundary", name)

    def on_boundary(self, name: str) -> None:
        replica = self.replicas[name]
        for done in replica.pop_finished():
            self.on_finished(self.inflight.pop(done.request_id), done)
        if replica.has_work():
            self.step(name)
        else:
            self.busy.discard(name)

    def scrape(self) -> None:
        metrics = {name: r.metrics() for name, r in self.replicas.items()}
        for name, m in metrics.items():
            self.scheduler.scraped(name, m)
        if self.busy:
            usage = [m.kv_cache_usage for m in metrics.values()]
            self.tally.spreads.append(max(usage) - min(usage))
        self.scheduler.observe(metrics)
        self.tally.limits.append(self.admission.limit)
        self.push(self.cluster.now + self.cluster.config.scrape_interval_s, "scrape")

    # -- results -------------------------------------------------------------------------------------

    def summary(self) -> ClusterResult:
        t = self.tally
        stats = [r.stats() for r in self.replicas.values()]
        metrics = [r.metrics() for r in self.replicas.values()]
        spans = tuple(end - start for start, end in zip(self.batch_start, self.batch_end))
        ttfts = np.array(t.ttfts) if t.ttfts else np.zeros(1)
        return ClusterResult(
            batch_makespans_s=spans,
            batch_starts_s=tuple(self.batch_start),
            makespan_s=max(self.batch_end) if self.batch_end else 0.0,
            rollouts=sum(len(b) for b in self.batches),
            finished_rollouts=t.finished,
            context_limited=t.context_limited,
            requests=t.requests,
            output_tokens=t.output_tokens,
            engine_generation_tokens=sum(s.generation_tokens for s in stats),
            preemptions=sum(s.preemptions for s in stats),
            recomputed_tokens=sum(s.recomputed_tokens for s in stats),
            prefix_queries=int(sum(m.prefix_cache_queries_total for m in metrics)),
            prefix_hits=int(sum(m.prefix_cache_hits_total for m in metrics)),
            followup_turns=t.followups,
            stayed_turns=t.stayed,
            kv_spread=float(np.mean(t.spreads)) if t.spreads else 0.0,
            limit_min=min(t.limits, default=self.admission.limit),
            limit_max=max(t.limits, default=self.admission.limit),
            ttft_p50_s=float(np.percentile(ttfts, 50)),
            ttft_p99_s=float(np.percentile(ttfts, 99)),
        )
