"""Probe single routing/admission configurations on the virtual-time cluster, beyond the benchmark's matrix.

Usage: .venv/bin/python bench/routing_probe.py [--seeds 10,11,12] [--async-steps 1,2] [--replicas 4] [--jobs 2]
       [--trace] CONFIG [CONFIG ...]

CONFIG is ``policy:cap[:move][:oracle]``: a routing policy, a cap of ``bench/routing.py`` (uncapped, fixed,
adaptive, adaptive-oc2, adaptive-whole), ``move`` for ``Router(rebalance=True)`` and ``oracle`` to admit
waiters in order of their true critical path (a clairvoyant ``pick``, for experiments only). For example
``available_kv:adaptive:move`` (ours) and ``available_kv:adaptive:move:oracle``. Tune on seeds other than the
benchmark's 0-2. ``--trace`` adds, per run and step, when the step's longest rollout was admitted and how
its run compared with its solo critical path: the numbers behind docs/notes/routing.md's session 2 findings.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import routing as bench
from routing_lab.cluster import Cluster, ClusterConfig
from routing_lab.oracle import OracleAdmission
from routing_lab.workload import RolloutPlan, WorkloadConfig, make_workload

from terminus_env.serving.admission import AdaptiveAdmission, Admission
from terminus_env.serving.router import POLICIES
from terminus_env.serving.scheduler import Scheduler

CAPS = (*bench.CAPS, bench.OVERCOMMIT, bench.WHOLE)  # adaptive-move is the ``:move`` flag here


@dataclass(frozen=True)
class Config:
    policy: str
    cap: str
    move: bool = False
    oracle: bool = False

    @classmethod
    def parse(cls, text: str) -> Config:
        policy, cap, *flags = text.split(":")
        unknown = set(flags) - {"move", "oracle"}
        if policy not in POLICIES or cap not in CAPS or unknown:
            raise ValueError(f"bad config {text!r}: want policy:cap[:move][:oracle] with a policy of "
                             f"{', '.join(POLICIES)} and a cap of {', '.join(CAPS)}")
        if "oracle" in flags and not cap.startswith("adaptive"):
            raise ValueError(f"bad config {text!r}: the oracle order needs an adaptive cap")
        return cls(policy, cap, "move" in flags, "oracle" in flags)

    def __str__(self) -> str:
        return ":".join([self.policy, self.cap] + ["move"] * self.move + ["oracle"] * self.oracle)


@dataclass(frozen=True)
class Outcome:
    ratio: float  # makespan / ideal bound
    preemption_rate: float
    stay_share: float
    trace: tuple[str, ...]


def _admission(config: Config, setup: bench.Setup, batches: Sequence[Sequence[RolloutPlan]]) -> Admission:
    admission = bench.admission_for(config.cap, setup, batches)
    if not config.oracle:
        return admission
    assert isinstance(admission, AdaptiveAdmission)  # Config.parse refuses the oracle with other caps
    paths = {p.rollout_id: bench.critical_path(p, setup.cluster.engine) for b in batches for p in b}
    return OracleAdmission(admission, paths)


def run(config: Config, k: int, seed: int, replicas: int, trace: bool) -> Outcome:
    setup = bench.Setup(ClusterConfig(num_replicas=replicas, engine=bench.ENGINE, max_async_steps=k),
                        WorkloadConfig(seed=seed, batch_size=4 * replicas))
    batches = make_workload(setup.workload)
    cluster = Cluster(setup.cluster)
    router = bench.router_for(cluster, config.policy, setup, rebalance=config.move)
    started: dict[str, float] = {}
    ended: dict[str, float] = {}
    if trace:  # a session's first route is its admission; its release is its end
        route, release = router.route, router.release
        router.route = lambda s, g=None: (started.setdefault(s, cluster.clock()), route(s, g))[1]  # type: ignore[method-assign]
        router.release = lambda s: (ended.setdefault(s, cluster.clock()), release(s))[1]  # type: ignore[method-assign]
    result = cluster.run(batches, Scheduler(router, _admission(config, setup, batches)))
    lines = []
    for s, batch in enumerate(batches if trace else ()):
        paths = {p.rollout_id: bench.critical_path(p, setup.cluster.engine) for p in batch}
        longest = max(paths, key=paths.__getitem__)
        lines.append(
            f"  seed {seed} K={k} step {s}: span {result.batch_makespans_s[s]:.1f} s, work floor "
            f"{bench.work_bound(batch, setup.cluster.engine, replicas):.1f} s, longest {longest} alone "
            f"{paths[longest]:.1f} s: admitted +{started[longest] - result.batch_starts_s[s]:.1f} s, ran "
            f"{(ended[longest] - started[longest]) / paths[longest]:.2f}x its solo time")
    return Outcome(result.makespan_s / bench.ideal_makespan(batches, setup.cluster), result.preemption_rate,
                   result.stay_share, tuple(lines))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("configs", nargs="+", help="policy:cap[:move][:oracle]")
    parser.add_argument("--seeds", default="10,11,12", help="comma-separated workload seeds")
    parser.add_argument("--async-steps", default="1,2", help="comma-separated max_async_steps values")
    parser.add_argument("--replicas", type=int, default=4, help="replicas; the batch is 4 prompts per replica")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--trace", action="store_true", help="print each step's longest rollout's timing")
    args = parser.parse_args(argv)
    try:
        configs = [Config.parse(text) for text in args.configs]
        seeds = [int(s) for s in args.seeds.split(",")]
        ks = [int(k) for k in args.async_steps.split(",")]
    except ValueError as exc:
        parser.error(str(exc))
    jobs = [(c, k, seed, args.replicas, args.trace) for c in configs for k in ks for seed in seeds]
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        outcomes = list(pool.map(run, *zip(*jobs)))
    for i in range(0, len(jobs), len(seeds)):
        config, k = jobs[i][0], jobs[i][1]
        group = outcomes[i: i + len(seeds)]
        print(f"{config!s:40} K={k}  x bound {statistics.fmean(o.ratio for o in group):.3f}  preempted "
              f"{100 * statistics.fmean(o.preemption_rate for o in group):.2f}%  stay "
              f"{statistics.fmean(o.stay_share for o in group):.3f}  per seed "
              f"{' '.join(f'{o.ratio:.2f}' for o in group)}")
        for line in (line for outcome in group for line in outcome.trace):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
