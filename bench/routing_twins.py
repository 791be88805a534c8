"""The HTTP benchmark's rows in virtual time, on its exact token streams, with the spread timing noise alone makes.

Usage: .venv/bin/python bench/routing_twins.py [--seeds 0,1,2] [--draws 8] [--jitter 0.02] [--jobs 2]
       [--http SEED0.json SEED1.json ...]

Each twin runs ``bench/routing_http.py``'s workload for a seed (the same chat turns, tokenized as the replicas
tokenize them) in the virtual-time cluster, through the production :class:`Scheduler`: ours, ours strictly
sticky, the clairvoyant order, and twins of ``vllm-router sticky_least_loaded`` behind the fixed cap, whose slots
the rollout side hands out first come first served (:class:`FixedAdmission` at the HTTP run's limit). Told when
sessions end (``/finish_session``, as deployed), that router sends a new session to the replica with the fewest
live sessions: our ``requests`` policy. Never told, it balances the sessions each replica was ever given
(``bench/router_placement.py``), a sticky round robin: ``round_robin``.

Over HTTP nothing happens exactly on plan: a tool's wait ends a few milliseconds late, requests reach the
replicas in a slightly different order. ``--draws N`` reruns every twin N times with each tool wait scaled by a
factor drawn uniformly from ``[1 - jitter, 1 + jitter]``; the spread of those makespans is how far one seed's
figure moves from noise alone, which is what a difference between two rows on one seed must beat. With
``--http``, the HTTP makespans of the same rows (``routing_http.py --json``) are printed beside their twins.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import routing as vt
import routing_http as http
from routing_lab.workload import RolloutPlan, WorkloadConfig

from terminus_env.serving.admission import Admission, FixedAdmission


@dataclass(frozen=True)
class Twin:
    label: str  # the HTTP row's label and cap, as routing_http.py prints them (a twin of no row: a label of its own)
    cap: str
    policy: str
    rebalance: bool = False
    oracle: bool = False


TWINS = (
    Twin("ours: available_kv + rebalance", "adaptive", "available_kv", rebalance=True),
    Twin("ours, strictly sticky", "adaptive", "available_kv"),
    Twin("clairvoyant order (reference)", "adaptive", "available_kv", rebalance=True, oracle=True),
    Twin("vllm-router sticky_least_loaded", "fixed", "requests"),
    Twin("sticky round robin (sessions never ended)", "fixed", "round_robin"),
)


def jittered(batches: Sequence[Sequence[RolloutPlan]], jitter: float, draw: int) -> list[list[RolloutPlan]]:
    """The plans with every tool wait scaled by its own factor in ``[1 - jitter, 1 + jitter]``; draw 0 is exact."""
    if draw == 0 or jitter == 0:
        return [list(b) for b in batches]
    rng = np.random.default_rng(draw)
    return [[replace(p, turns=tuple(replace(t, tool_wait_s=t.tool_wait_s * rng.uniform(1 - jitter, 1 + jitter))
                                    for t in p.turns)) for p in batch] for batch in batches]


def setup_for(seed: int) -> http.Setup:
    """``routing_http.py``'s default setup for a seed."""
    return http.Setup(4, vt.ENGINE, WorkloadConfig(seed=seed), 2, 0.5)


@functools.cache
def exact_plans(setup: http.Setup) -> list[list[RolloutPlan]]:
    """The HTTP run's token-exact plans for a setup, built once per process."""
    return http.workload(setup)[1]


def run(twin: Twin, setup: http.Setup, jitter: float, draw: int) -> tuple[float, float]:
    """One twin on one (jittered) workload: its makespan in simulated seconds and its preemption rate."""
    exact = exact_plans(setup)
    admission: Admission
    if twin.cap == "fixed":
        admission = FixedAdmission(http.fixed_limit(setup, exact))
    else:
        admission = http.our_admission(http.PoolSpec(oracle=twin.oracle), setup, exact)
    result = http.run_virtual(setup, jittered(exact, jitter, draw), twin.policy, twin.rebalance, admission)
    return result.makespan_s, result.preemption_rate


def http_makespans(files: Sequence[Path]) -> dict[tuple[int, str, str], float]:
    out = {}
    for f in files:
        data = json.loads(f.read_text())
        seed = data["setup"]["workload"]["seed"]
        for row in data["rows"]:
            out[seed, row["label"], row["cap"]] = row["makespan_s"]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated workload seeds")
    parser.add_argument("--draws", type=int, default=8, help="jittered reruns per twin and seed")
    parser.add_argument("--jitter", type=float, default=0.02, help="the largest relative change of a tool wait")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--http", nargs="*", type=Path, default=[], help="routing_http.py --json files to compare")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.draws < 0 or not 0 <= args.jitter < 1:
        parser.error("--draws must be >= 0 and --jitter in [0, 1)")
    jobs = [(t, setup_for(s), args.jitter, d) for s in seeds for t in TWINS for d in range(args.draws + 1)]
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        outcomes = pool.map(run, *zip(*jobs))
        results = {(t, setup.workload.seed, d): o for (t, setup, _, d), o in zip(jobs, outcomes)}
    measured = http_makespans(args.http)
    print(f"tool waits jittered by up to ±{100 * args.jitter:g}%, {args.draws} draws per twin and seed; makespans "
          f"in simulated seconds; preemptions: the median draw's share of requests")
    print(f"{'seed':<5}{'row':<44}{'cap':<9}{'exact':>8}{'min':>8}{'median':>8}{'max':>8}{'spread':>8}"
          f"{'preempt%':>9}{'HTTP':>8}")
    summary: dict[Twin, list[tuple[float, float, float]]] = {t: [] for t in TWINS}
    for s in seeds:
        for t in TWINS:
            exact = results[t, s, 0][0]
            draws = sorted(results[t, s, d] for d in range(1, args.draws + 1)) or [results[t, s, 0]]
            median, median_preempted = draws[(len(draws) - 1) // 2]  # the lower median: a draw that ran
            spread = (draws[-1][0] - draws[0][0]) / median
            summary[t].append((median, draws[-1][0], median_preempted))
            seen = measured.get((s, t.label, t.cap))
            print(f"{s:<5}{t.label:<44}{t.cap:<9}{exact:>8.1f}{draws[0][0]:>8.1f}{median:>8.1f}{draws[-1][0]:>8.1f}"
                  f"{100 * spread:>7.1f}%{100 * median_preempted:>9.2f}{'' if seen is None else f'{seen:.1f}':>8}")
    print(f"\nmeans over seeds {args.seeds}: of each seed's median draw, of its worst draw, and of the median draw's "
          "preemptions")
    for t, rows in summary.items():
        median, worst, preempted = (statistics.fmean(column) for column in zip(*rows))
        print(f"{t.label:<44}{t.cap:<9}median {median:>7.1f}  worst {worst:>7.1f}  preempted {100 * preempted:.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
