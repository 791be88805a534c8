"""Throughput at one admission limit: a stream of rollouts through ``ServingPool``, measured over a window.

A throughput-against-concurrency curve is taken in steady state, not over a batch's tail: every rollout of the
stream asks for admission at once, the pool's admission controller keeps as many in flight as it allows (a
``FixedAdmission(c)`` for a point of the sweep, ``AdaptiveAdmission`` for ours), each finished rollout's slot goes to
the next, and the engines' counters are read at the end of a warm-up and at the end of the window. With several
phases the stream's traces grow during the run: phase ``k``'s rollouts ask for admission ``k × phase_s`` after the
start, and the earlier phases' rollouts still waiting give up then (those running finish), so every point of a sweep
sees the same traces at the same time whatever its throughput. Times are simulated seconds × ``time_scale`` (1 on
real engines). A window may instead be counted in rollouts (:meth:`Window.counted`): the counters are read once a
number of rollouts have finished and again once a number more have, so a point does a fixed amount of work however
fast the machine runs, and its window lasts what that work took. At the end every rollout still running is cancelled
(vLLM aborts a request whose client went away) and the engines are left idle with empty prefix caches.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

from routing_lab.chat import ChatRollout
from routing_lab.engines import Counters, Load, LoadSampler, max_lag_s, read_counters, settle, total
from routing_lab.http_run import PoolEndpoint, Tally, play_rollout
from terminus_env.serving.pool import ServingPool

SAMPLE_S = 0.5  # how often the admission limit and the rollouts in flight are sampled


@dataclass(frozen=True)
class Window:
    warmup_s: float  # simulated seconds before the counters are first read
    window_s: float  # simulated seconds measured
    phase_s: float = 0.0  # with several phases: simulated seconds between them
    warmup_rollouts: int = 0  # counted: rollouts finished before the counters are first read
    window_rollouts: int = 0  # counted: rollouts finished inside the window (0: the window is timed)

    def __post_init__(self) -> None:
        if self.window_rollouts and self.phase_s:
            raise ValueError("a window counted in rollouts runs one phase: phases are released by the clock")

    @classmethod
    def counted(cls, warmup_rollouts: int, window_rollouts: int) -> Window:
        """A window of ``window_rollouts`` finished rollouts after ``warmup_rollouts``; the stream must hold
        more rollouts than the admission limit plus both, so that the limit stays full until the window ends."""
        if warmup_rollouts < 0 or window_rollouts < 1:
            raise ValueError(f"a counted window needs rollouts to count, got {warmup_rollouts} and {window_rollouts}")
        return cls(0.0, 0.0, warmup_rollouts=warmup_rollouts, window_rollouts=window_rollouts)


@dataclass(frozen=True)
class Point:
    """One admission controller's run: the engines' counters over the window, and what the driver saw."""

    label: str
    window_s: float  # simulated seconds (a counted window: what it took)
    counters: Counters  # summed over the replicas, over the window
    per_replica: tuple[Counters, ...]
    load: Load
    in_flight: float  # mean rollouts admitted and not finished, over the window
    limit_min: int
    limit_max: int
    rollouts_done: int  # rollouts that finished inside the window
    final_traces: tuple[int, ...]  # their traces at the end (last prompt + last output), in the engine's tokens
    context_limited: int  # rollouts that ended at the context limit, whole run
    load_average: float  # the machine's 1-minute load average at the end of the window
    wall_s: float
    lag_s: float = 0.0  # simulated replicas: the most an engine ran behind the wall clock (0 on vLLM)
    client_requests: int = 0  # requests that ended inside the window, as the client saw them
    client_s: float = 0.0  # their total seconds from sent to answered (simulated)

    @property
    def tokens_per_s(self) -> float:
        return self.counters.generation_tokens / self.window_s

    @property
    def rollouts_per_s(self) -> float:
        return self.rollouts_done / self.window_s

    @property
    def preempted_per_100(self) -> float:
        """Preemptions per 100 finished requests."""
        return 100 * self.counters.preemptions / self.counters.requests if self.counters.requests else 0.0

    @property
    def queue_s(self) -> float:
        """Mean time a request waited in the engine before its first step."""
        return self.counters.queue_s / self.counters.queued if self.counters.queued else 0.0

    @property
    def prefix_hit(self) -> float:
        c = self.counters
        return c.prefix_hits / c.prefix_queries if c.prefix_queries else 0.0

    @property
    def flops_per_token(self) -> float:
        """vLLM's estimated FLOPs per generated token (0 where the server has no estimate)."""
        c = self.counters
        return c.flops / c.generation_tokens if c.generation_tokens else 0.0


async def run_point(label: str, pool: ServingPool, phases: Sequence[Sequence[ChatRollout]], window: Window,
                    time_scale: float, extra: dict | None = None) -> Point:
    """The stream through ``pool`` (its admission controller sets the concurrency); see the module's docstring.
    ``extra`` adds fields to every request's body."""
    urls = pool.replicas
    loop = asyncio.get_running_loop()
    endpoint = PoolEndpoint(pool, forced=True, extra=extra)
    tally = Tally()
    admitted: set[str] = set()
    ended: dict[str, float] = {}
    tasks: dict[str, asyncio.Task] = {}
    t0 = loop.time()
    started = time.perf_counter()

    progress = asyncio.Event()  # set whenever a rollout ends, finished or failed

    async def rollout(ro: ChatRollout) -> None:
        try:
            await play_rollout(ro, endpoint, tally, time_scale, on_admitted=lambda: admitted.add(ro.rollout_id))
            ended[ro.rollout_id] = (loop.time() - t0) / time_scale
        finally:
            progress.set()

    async def release() -> None:
        for k, phase in enumerate(phases):
            await asyncio.sleep(max(0.0, t0 + k * window.phase_s * time_scale - loop.time()))
            for rid, task in tasks.items():  # the earlier phases' rollouts still waiting give up
                if rid not in admitted:
                    task.cancel()
            tasks.update({ro.rollout_id: asyncio.create_task(rollout(ro)) for ro in phase})

    async def finished(count: int) -> None:
        """Until ``count`` rollouts have finished; an error when the stream ends short of that."""
        while len(ended) < count:
            if releaser.done() and all(task.done() for task in tasks.values()):
                failed = [t.exception() for t in tasks.values() if not t.cancelled() and t.exception() is not None]
                raise RuntimeError(f"{label}: the stream ended after {len(ended)} finished rollouts, short of the "
                                   f"{count} its window counts; " + (f"{len(failed)} failed, the first with "
                                   f"{failed[0]!r}" if failed else "give it more rollouts"))  # fmt: skip
            progress.clear()
            await progress.wait()

    limits: list[int] = []
    flying: list[int] = []

    def sample_admission() -> None:
        admission = pool.admission
        if admission is not None:
            limits.append(admission.limit)
            flying.append(admission.in_flight)

    async def sample() -> None:
        while True:
            await asyncio.sleep(SAMPLE_S * time_scale)
            sample_admission()

    releaser = asyncio.create_task(release())
    try:
        if window.window_rollouts:
            await finished(window.warmup_rollouts)
        else:
            await asyncio.sleep(window.warmup_s * time_scale)
        before = await read_counters(urls)
        # Only now: a rollout that ends while the counters are read (a burst of them at a full limit) has its tokens
        # in ``before``, and must not count in the window either.
        opened, ended_before = loop.time(), set(ended)
        client_before = (tally.requests, tally.request_s)
        sample_admission()
        sampler = asyncio.create_task(sample())
        with LoadSampler(urls, SAMPLE_S * time_scale) as load:
            if window.window_rollouts:
                await finished(len(ended_before) + window.window_rollouts)
            else:
                await asyncio.sleep(window.window_s * time_scale)
        closed, ended_inside = loop.time(), set(ended) - ended_before
        after = await read_counters(urls)
        client = (tally.requests - client_before[0], (tally.request_s - client_before[1]) / time_scale)
        lag = await max_lag_s(urls)
        sampler.cancel()
    finally:
        releaser.cancel()
        for task in tasks.values():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await releaser
        results = await asyncio.gather(*tasks.values(), return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError)]
    if failures:
        raise RuntimeError(f"{label}: {len(failures)} rollouts failed, the first with {failures[0]!r}") from failures[0]
    await settle(urls)
    if window.window_rollouts:  # what the counted window took, and the rollouts it counted
        window_s = (closed - opened) / time_scale
        done = {rid: ended[rid] for rid in ended_inside}
    else:
        lo, window_s = window.warmup_s, window.window_s
        done = {rid: t for rid, t in ended.items() if lo <= t <= lo + window_s}
    by_id = {ro.rollout_id: ro for phase in phases for ro in phase}
    traces = []
    for rid in done:
        turns = [turn for (r, turn) in tally.prompt_tokens if r == rid]
        if turns:
            last = max(turns)
            traces.append(tally.prompt_tokens[rid, last] + len(by_id[rid].turns[last].reply.split()) + 1)
    per = {url: after[url].minus(before[url]) for url in urls}
    return Point(
        label=label, window_s=window_s, counters=total(per), per_replica=tuple(per.values()), load=load.load(),
        in_flight=statistics.fmean(flying) if flying else 0.0, limit_min=min(limits, default=0),
        limit_max=max(limits, default=0), rollouts_done=len(done), final_traces=tuple(traces),
        context_limited=tally.context_limited, load_average=os.getloadavg()[0], wall_s=time.perf_counter() - started,
        lag_s=lag, client_requests=client[0], client_s=client[1],
    )  # fmt: skip
