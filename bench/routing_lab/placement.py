"""Ours against the routers people deploy, on the same replicas: makespan, preemptions, prefix hits, load spread.

One run per seed of ``routing_lab``'s agentic workload at a CPU's scale (GRPO groups of 4, heavy-tailed turns with
tool waits, three training steps with two in flight, traces growing 25% a step), through each row in turn on the same
replicas, whose prefix caches are emptied and whose engines are idle before each row (``routing_http.run_row`` on
live replicas). The rows:

- ours: ``ServingPool`` with ``available_kv`` placement, adaptive admission and rebalancing; and the same with the
  admission's overcommit probe on (``max_target_scale`` 2 and 4), since recomputation is cheap on a CPU;
- ``least_requests`` (sticky, verl's placement) through the pool, uncapped and behind the capacity formula's fixed cap;
- ``vllm-router`` (the real process, from PyPI) ``sticky_least_loaded`` and ``cache_aware`` behind the fixed cap (the
  better cap for both in ``docs/notes/routing.md``), told when each session ends (``POST /finish_session``).

The row order rotates with the seed, so a drift in the machine's load does not always land on the same row. Per row:
the makespan; vLLM's preemptions (% of requests); its prefix-cache hit rate; the spread of load across replicas (the
mean gap in KV pinned, sampled twice a second while any replica is busy, and the busiest replica's share of the output
tokens).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import fmean as mean

import routing_http as http

from routing_lab.chat import write_replies
from routing_lab.engines import (
    MODEL_NAME,
    SIM_TIME_SCALE,
    Counters,
    Fleet,
    Load,
    LoadSampler,
    max_lag_s,
    read_counters,
    settle,
    total,
)
from routing_lab.processes import Processes, RouterSpec
from routing_lab.workload import WorkloadConfig
from terminus_env.serving.sim.engine import SimConfig

OURS = http.Row("ours: available_kv + adaptive + rebalance", "adaptive", pool=http.PoolSpec())
OURS_KEY = (OURS.label, OURS.cap)
# The same with overcommit probed (AdaptiveAdmission(max_target_scale=...)): past its KV budget while the engines
# have less than 80% of their KV pinned, backed off by their preemptions; on a CPU, where recomputation is cheap.
OVERCOMMIT = tuple(http.Row(f"ours, overcommit probed to {scale:g}x", "adaptive",
                            pool=http.PoolSpec(max_target_scale=scale)) for scale in (2.0, 4.0))  # fmt: skip
ROWS = (
    OURS,
    *OVERCOMMIT,
    http.Row("least_requests (pool, sticky)", "uncapped",
             pool=http.PoolSpec("least_requests", rebalance=False, admission="uncapped")),
    http.Row("least_requests (pool, sticky)", "fixed",
             pool=http.PoolSpec("least_requests", rebalance=False, admission="fixed")),
    http.Row("vllm-router sticky_least_loaded", "fixed", router=RouterSpec("vllm-router", "sticky_least_loaded")),
    http.Row("vllm-router cache_aware", "fixed", router=RouterSpec("vllm-router", "cache_aware")),
)  # fmt: skip
WORKLOAD = WorkloadConfig(steps=3, batch_size=8, group_size=4, system_prompt_tokens=256, task_prompt_tokens_median=256,
                          turns_median=4.0, max_turns=16, output_tokens_median=48.0, tool_tokens_median=64.0,
                          max_tokens=512)  # fmt: skip
# quick: every row's code path on a small fixed workload (two steps of 2 prompts x 4, median 2 turns of 24 tokens)
QUICK_WORKLOAD = replace(WORKLOAD, steps=2, batch_size=2, turns_median=2.0, max_turns=6, output_tokens_median=24.0,
                         tool_wait_median_s=0.1)  # fmt: skip
ASYNC_STEPS = 2
SEEDS = (0, 1, 2)


@dataclass(frozen=True)
class RowRun:
    side: str  # "vLLM" | "sim"
    seed: int
    label: str
    cap: str
    limit: str
    makespan_s: float  # simulated seconds (real seconds on vLLM)
    requests: int
    output_tokens: int
    counters: Counters  # summed over the replicas, over the row
    per_replica: tuple[Counters, ...]
    load: Load
    load_average: float  # the machine's 1-minute load average when the row ended
    wall_s: float
    lag_s: float  # simulated replicas: the most an engine ran behind the wall clock

    @property
    def key(self) -> tuple[str, str]:
        return self.label, self.cap

    @property
    def preempted_pct(self) -> float:
        return 100 * self.counters.preemptions / self.requests if self.requests else 0.0

    @property
    def prefix_hit(self) -> float:
        c = self.counters
        return c.prefix_hits / c.prefix_queries if c.prefix_queries else 0.0

    @property
    def busiest_share(self) -> float:
        """The busiest replica's share of the output tokens (1 / replicas when even)."""
        tokens = [c.generation_tokens for c in self.per_replica]
        return max(tokens) / sum(tokens) if sum(tokens) else 0.0


def rows(only: Sequence[str]) -> list[http.Row]:
    return [r for r in ROWS if not only or r is OURS or any(text in f"{r.label} {r.cap}" for text in only)]


def base_setup(fleet: Fleet, quick: bool) -> http.Setup:
    """The workload on the fleet's vLLM replicas, in its words; caps from the engine's blocks and the measured
    tokens per planned token (``routing_http.live_setup``)."""
    setup = http.Setup(fleet.shape.replicas, fleet.shape.sim_config(SimConfig()), QUICK_WORKLOAD if quick else WORKLOAD,
                       ASYNC_STEPS, 1.0, vocabulary=fleet.words, allowed_token_ids=fleet.word_ids)  # fmt: skip
    return http.live_setup(setup, fleet.urls, MODEL_NAME)


def sim_setup(live: http.Setup, fleet: Fleet, calibrated: SimConfig, urls: Sequence[str],
              time_scale: float) -> http.Setup:
    """The same runs on simulated replicas standing for the fleet's: the calibrated engine, the model's tokenizer,
    the same caps."""
    return replace(live, engine=calibrated, time_scale=time_scale, live=tuple(urls), tokenizer=str(fleet.model_dir))


def run_seed(setup: http.Setup, seed: int, chosen: Sequence[http.Row], side: str, logs: Path) -> list[RowRun]:
    """Every chosen row on ``setup``'s replicas (live: vLLM's, or simulated ones started by the caller), in an order
    rotated by the seed."""
    setup = replace(setup, workload=replace(setup.workload, seed=seed))
    chats, twins = http.workload(setup)
    replies = write_replies(chats, logs / f"replies-{side}-{seed}.jsonl")
    shift = seed % len(chosen)
    out = []
    for row in [*chosen[shift:], *chosen[:shift]]:
        out.append(run_one(row, setup, chats, twins, replies, logs, seed, side))
        r = out[-1]
        print(f"  {side:5} seed {seed} {row.label} ({row.cap}, limit {r.limit}): makespan {r.makespan_s:.1f} s, "
              f"preempted {r.preempted_pct:.2f}%, prefix hit {r.prefix_hit:.3f}, KV spread {r.load.kv_spread:.2f} "
              f"({r.wall_s:.0f} s wall, load {r.load_average:.1f}{f', engine lag {r.lag_s:.2f} s' if r.lag_s else ''})",
              flush=True)  # fmt: skip
    return out


def run_one(row: http.Row, setup: http.Setup, chats: list, twins: list, replies: Path, logs: Path, seed: int,
            side: str) -> RowRun:
    urls = list(setup.live)
    asyncio.run(settle(urls))
    before = asyncio.run(read_counters(urls))
    started = time.perf_counter()
    with LoadSampler(urls, 0.5 * setup.time_scale) as sampler:
        result, limit = http.run_row(row, setup, chats, twins, replies, logs)
    after = asyncio.run(read_counters(urls))
    per = tuple(after[u].minus(before[u]) for u in urls)
    return RowRun(side, seed, row.label, row.cap, limit, result.makespan_s, result.requests, result.output_tokens,
                  total(dict(zip(urls, per))), per, sampler.load(), os.getloadavg()[0], time.perf_counter() - started,
                  asyncio.run(max_lag_s(urls)))  # fmt: skip


def run_sim(live: http.Setup, fleet: Fleet, calibrated: SimConfig, seeds: Sequence[int], chosen: Sequence[http.Row],
            logs: Path, time_scale: float = SIM_TIME_SCALE) -> list[RowRun]:
    """The simulator's prediction: per seed, simulated replicas with that seed's replies, every row in turn."""
    out = []
    for seed in seeds:
        chats, _ = http.workload(replace(live, workload=replace(live.workload, seed=seed)))
        replies = write_replies(chats, logs / f"sim-replies-{seed}.jsonl")
        with Processes(logs) as procs:
            urls = procs.replicas(fleet.shape.replicas, calibrated, time_scale, replies, MODEL_NAME,
                                  tokenizer=fleet.model_dir, weight_sync=True)  # fmt: skip
            out += run_seed(sim_setup(live, fleet, calibrated, urls, time_scale), seed, chosen, "sim", logs)
    return out


def revive(r: dict) -> RowRun:
    return RowRun(**{**r, "counters": Counters(**r["counters"]),
                     "per_replica": tuple(Counters(**c) for c in r["per_replica"]), "load": Load(**r["load"])})


# -- the report ----------------------------------------------------------------------------------------------------


def _by_row(runs: Sequence[RowRun]) -> dict[tuple[str, str], dict[int, RowRun]]:
    out: dict[tuple[str, str], dict[int, RowRun]] = {}
    for r in runs:
        out.setdefault(r.key, {})[r.seed] = r
    return out


def table(runs: Sequence[RowRun], side: str) -> str:
    """Means over the seeds, each row's makespan against ours on the same seed."""
    by = _by_row(runs)
    ours = by.get(OURS_KEY, {})
    head = (f"{'row':<44}{'cap':<9}{'limit':>6}{'seeds':>7}{'makespan s':>11}{'x ours':>7}{'preempt %':>10}"
            f"{'prefix hit':>11}{'KV spread':>10}{'busiest':>8}{'out tok/s':>10}{'load':>6}")
    lines = [f"{side}: means over seeds", head, "-" * len(head)]
    for key, seeds in by.items():
        rs = list(seeds.values())
        ratio = [r.makespan_s / ours[r.seed].makespan_s for r in rs if r.seed in ours]

        lines.append(
            f"{key[0]:<44}{key[1]:<9}{rs[0].limit:>6}{','.join(str(r.seed) for r in rs):>7}"
            f"{mean(r.makespan_s for r in rs):>11.1f}{mean(ratio) if ratio else 0:>7.2f}"
            f"{mean(r.preempted_pct for r in rs):>10.2f}{mean(r.prefix_hit for r in rs):>11.3f}"
            f"{mean(r.load.kv_spread for r in rs):>10.2f}{mean(r.busiest_share for r in rs):>8.2f}"
            f"{mean(r.output_tokens / r.makespan_s for r in rs):>10.0f}{mean(r.load_average for r in rs):>6.1f}")
    return "\n".join(lines)


def seed_table(runs: Sequence[RowRun]) -> str:
    head = (f"{'side':<6}{'seed':>5}  {'row':<44}{'cap':<9}{'makespan s':>11}{'preempted':>10}{'% req':>7}"
            f"{'prefix hit':>11}{'KV spread':>10}{'busiest':>8}{'wall s':>7}{'load':>6}")
    lines = [head, "-" * len(head)]
    for r in sorted(runs, key=lambda r: (r.side, r.seed)):
        lines.append(f"{r.side:<6}{r.seed:>5}  {r.label:<44}{r.cap:<9}{r.makespan_s:>11.1f}"
                     f"{r.counters.preemptions:>10.0f}{r.preempted_pct:>7.2f}{r.prefix_hit:>11.3f}"
                     f"{r.load.kv_spread:>10.2f}{r.busiest_share:>8.2f}{r.wall_s:>7.0f}{r.load_average:>6.1f}")
    return "\n".join(lines)


def _standing(ours: Sequence[float], theirs: Sequence[float]) -> str:
    """Lower is better: ahead when ours is lower on every seed, behind when higher on every seed, else tied."""
    if all(o < t for o, t in zip(ours, theirs)):
        return "ahead"
    if all(o > t for o, t in zip(ours, theirs)):
        return "behind"
    return "tied"


def verdicts(runs: Sequence[RowRun], side: str, mine: http.Row = OURS) -> list[str]:
    """One of our rows against each other row (an overcommit row: against the others' rows only), seed by seed:
    makespan and preemptions."""
    by = _by_row(runs)
    ours = by.get((mine.label, mine.cap))
    if not ours:
        return []
    name = "ours" if mine is OURS else mine.label
    skip = {OURS_KEY} if mine is OURS else {(r.label, r.cap) for r in (OURS, *OVERCOMMIT)}
    out = []
    for key, seeds in by.items():
        if key in skip:
            continue
        common = sorted(set(seeds) & set(ours))
        if not common:
            continue
        o, t = [ours[s] for s in common], [seeds[s] for s in common]
        ratios = [b.makespan_s / a.makespan_s for a, b in zip(o, t)]
        makespan = _standing([r.makespan_s for r in o], [r.makespan_s for r in t])
        preemptions = _standing([r.counters.preemptions for r in o], [r.counters.preemptions for r in t])
        out.append(
            f"[{side}] {name} vs {key[0]} {key[1]}: makespan {makespan}"
            f" ({statistics.fmean(ratios):.2f}x theirs over ours, per seed {', '.join(f'{x:.2f}' for x in ratios)}); "
            f"preemptions {preemptions} "
            f"({sum(r.counters.preemptions for r in o):.0f} against {sum(r.counters.preemptions for r in t):.0f}, "
            f"seeds {','.join(map(str, common))})")
    return out


def fidelity(engine: Sequence[RowRun], sim: Sequence[RowRun]) -> list[str]:
    """Per row: the engine's makespan against ours next to the simulator's, and whether they differ by more than the
    engine's seeds spread."""
    e, s = _by_row(engine), _by_row(sim)
    out = []
    for key in e:
        if key not in s or OURS_KEY not in e or OURS_KEY not in s:
            continue
        er = [e[key][k].makespan_s / e[OURS_KEY][k].makespan_s for k in e[key] if k in e[OURS_KEY]]
        sr = [s[key][k].makespan_s / s[OURS_KEY][k].makespan_s for k in s[key] if k in s[OURS_KEY]]
        if not er or not sr:
            continue
        spread = max(er) - min(er)
        gap = statistics.fmean(sr) - statistics.fmean(er)
        judged = "one seed: not judged" if len(er) < 2 else "agree" if abs(gap) <= spread else "DISAGREE"
        ep = statistics.fmean(r.preempted_pct for r in e[key].values())
        sp = statistics.fmean(r.preempted_pct for r in s[key].values())
        eh = statistics.fmean(r.prefix_hit for r in e[key].values())
        sh = statistics.fmean(r.prefix_hit for r in s[key].values())
        out.append(f"[{judged}] {key[0]} {key[1]}: x ours vLLM "
                   f"{statistics.fmean(er):.2f} (seeds spread {spread:.2f}), simulator {statistics.fmean(sr):.2f}; "
                   f"preempted vLLM {ep:.2f}%, simulator {sp:.2f}%; prefix hit vLLM {eh:.3f}, simulator {sh:.3f}")
    return out


def results(engine: Sequence[RowRun], sim: Sequence[RowRun], setup: http.Setup) -> dict:
    return {"workload": dataclasses.asdict(setup.workload), "async_steps": setup.async_steps,
            "token_ratio": setup.token_ratio, "runs": [dataclasses.asdict(r) for r in [*engine, *sim]]}


def report(data: dict) -> str:
    runs = [revive(r) for r in data["runs"]]
    engine = [r for r in runs if r.side == "vLLM"]
    sim = [r for r in runs if r.side == "sim"]
    lines = [seed_table(runs), table(engine, "vLLM")]
    if sim:
        lines.append(table(sim, "simulator"))
    for mine in (OURS, *OVERCOMMIT):
        lines += verdicts(engine, "vLLM", mine) + verdicts(sim, "simulator", mine)
    lines += fidelity(engine, sim)
    return "\n".join(lines)
