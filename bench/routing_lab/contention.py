"""What a shared host costs the engine benchmarks' replicas, measured in a run, for the simulator.

Isolated probes (``bench/calibrate_sim.py``) time one batch at a time, with the machine otherwise quiet. In a run the
two replicas' model workers, their engine cores, their HTTP servers and the benchmark's client share two cores, and a
request takes longer on both sides of the engine: its steps run slower (vLLM's inter-token latency rose from 3.3 ms to
13 ms between 8 and 64 rollouts in flight, at a batch the probes time at 3-4 ms) and it spends time in no engine
state at all (the client's latency minus vLLM's queue and inference time: 0.1 s at 8 in flight, 0.75 s at 64).

:func:`measure` runs the knee's steady stream at a few admission limits on the live replicas and reads both from
vLLM's own figures over a window (inter-token latency, steps, queue and inference time) and the client's latency;
:func:`fit` turns them into the simulated replica's ``step_contention`` and ``frontend_s`` curves, keyed by the
requests open at a replica (the client's latency × its request rate ÷ replicas, by Little's law). The step curve
scales the probes' model to the run's own step times, so the probes set only the relative costs of a step's parts.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from routing_lab.closed_loop import Point, Window, run_point
from routing_lab.engines import MODEL_NAME
from terminus_env.serving.admission import FixedAdmission
from terminus_env.serving.pool import ServingPool
from terminus_env.serving.sim.engine import SimConfig

LIMITS = (4, 8, 16, 32, 64)
QUICK_LIMITS = (4, 16, 64)
WINDOW = Window(warmup_s=8.0, window_s=20.0)
QUICK_WINDOW = Window.counted(warmup_rollouts=2, window_rollouts=6)  # a fixed amount of work (the knee's quick stream)


@dataclass(frozen=True)
class LoadPoint:
    """One admission limit's figures, per replica and per request."""

    limit: int
    open_requests: float  # mean requests open at a replica (sent, not answered), by Little's law
    itl_s: float  # vLLM's mean inter-token latency: the time of the steps decoding requests ran in
    model_step_s: float  # the probes' step-time model for this point's mean step
    outside_s: float  # per request: the client's latency minus vLLM's queue and inference time
    load_average: float

    @property
    def step_multiplier(self) -> float:
        """vLLM's step time in the run over the probes' model: the scale the probes' relative costs run at (below
        1 where the probes, timed at another moment of a shared machine, ran slower than the run)."""
        return self.itl_s / self.model_step_s


def load_point(point: Point, steps: SimConfig, replicas: int, http_overhead_s: float) -> LoadPoint:
    """The figures of one run at a fixed limit. The model's step is the probes' time for the run's mean decode step:
    ``n + 1`` sequences for a mean of ``n`` decoding per step (a token sees the batch it is in, larger on average
    than the mean batch), the step's mean scheduled tokens, and the prefill pairs the run computed spread over its
    steps."""
    c = point.counters
    if not (c.steps and c.itl_count and c.requests and point.client_requests):
        raise ValueError(f"{point.label}: no engine steps, tokens or requests in the window; lengthen it")
    batch = c.itl_count / c.steps + 1
    prompt = c.prompt_tokens / c.requests
    computed = (c.prompt_tokens - c.prefix_hits) / c.requests
    pairs = c.requests * computed * (prompt - computed / 2) / c.steps
    context = batch * (prompt + c.generation_tokens / c.requests / 2)
    model = (steps.step_base_s + steps.step_per_token_s * c.step_tokens / c.steps + steps.step_per_seq_s * batch
             + steps.step_per_context_token_s * context + steps.step_per_token_pair_s * pairs)  # fmt: skip
    queue = c.queue_s / c.queued if c.queued else 0.0
    client = point.client_s / point.client_requests
    return LoadPoint(limit=int(point.label.split()[-1]), open_requests=point.client_s / point.window_s / replicas,
                     itl_s=c.itl_s / c.itl_count, model_step_s=model,
                     outside_s=max(0.0, client - queue - c.inference_s / c.requests - http_overhead_s),
                     load_average=point.load_average)  # fmt: skip


def fit(points: Sequence[LoadPoint], steps: SimConfig) -> SimConfig:
    """``steps`` with the curves the points give (sorted by requests open; points that open no more requests than an
    earlier one are dropped: the curves rise in their x)."""
    kept: list[LoadPoint] = []
    for p in sorted(points, key=lambda p: p.open_requests):
        if not kept or p.open_requests > kept[-1].open_requests:
            kept.append(p)
    return dataclasses.replace(steps, step_contention=tuple((p.open_requests, p.step_multiplier) for p in kept),
                               frontend_s=tuple((p.open_requests, p.outside_s) for p in kept))  # fmt: skip


def measure(urls: Sequence[str], rollouts: Sequence, limits: Sequence[int], window: Window,
            extra: dict) -> list[Point]:
    """The steady stream at each limit on the live replicas (sessions placed by live count, as the knee's sweep)."""

    async def one(limit: int) -> Point:
        async with ServingPool(urls, MODEL_NAME, policy="requests", admission=FixedAdmission(limit),
                               scrape_interval_s=1.0) as pool:  # fmt: skip
            return await run_point(f"fixed {limit}", pool, [rollouts], window, 1.0, extra)

    return [asyncio.run(one(limit)) for limit in limits]


def describe(points: Sequence[LoadPoint]) -> str:
    head = f"{'limit':>6}{'open/replica':>13}{'ITL ms':>8}{'model ms':>9}{'x step':>7}{'outside s':>10}{'load':>6}"
    lines = [head, "-" * len(head)]
    for p in points:
        lines.append(f"{p.limit:>6}{p.open_requests:>13.1f}{1000 * p.itl_s:>8.2f}{1000 * p.model_step_s:>9.2f}"
                     f"{p.step_multiplier:>7.2f}{p.outside_s:>10.3f}{p.load_average:>6.1f}")
    return "\n".join(lines)
