"""The serving claims on real engines: the capacity formula against vLLM's knee, our placement against vllm-router's.

Usage (in .venv-vllm, which ``make test-vllm`` installs):
    .venv-vllm/bin/python bench/engines.py knee [--json FILE] [--figure FILE]        # about 50 minutes
    .venv-vllm/bin/python bench/engines.py placement [--seeds 0,1,2] [--json FILE]  # about 50 minutes
    .venv-vllm/bin/python bench/engines.py quick [--json FILE]                      # both, on a fixed small workload
    .venv-vllm/bin/python bench/engines.py knee --report FILE [--figure FILE]     # print (and draw) a saved run
Options: --no-sim (skip the simulator's prediction), --logs DIR (keep the replicas' logs and the model), --replica-url
URL (twice) --replica-logs DIR (replicas already running in the benchmark's shape, their serve --log-dir: measured
instead of starting two, and left running),
--engine-from JSON (vLLM's side from an earlier run: only the simulator runs), --calibration-from JSON, for knee
--limits 4,8,... --workloads steady,growing --warmup S --window S, for placement --rows TEXT ... (ours always runs).

Two vLLM replicas on this machine's CPU (``routing_lab/engines.py``: the tiny random model, one core each, a KV pool
of 384 blocks of 32 tokens each, chunked prefill off) serve ``routing_lab``'s agentic workload sized for the CPU, in
words the model's tokenizer makes one token each. ``knee`` sweeps the admission limit on a stream of rollouts and
reads vLLM's counters over a window (``routing_lab/knee.py``); ``placement`` runs ours and the deployed routers on the
same replicas, one run per seed (``routing_lab/placement.py``). ``quick`` runs both on a fixed, small amount of work
(one seed, short rollouts, the model cut to one layer, each point of the sweep counted in finished rollouts instead of
timed), so that it does the same work on any machine and only its time changes. Before the runs, the KV bytes per
token the formula uses (from the model's config) are checked against what vLLM made of its KV memory, and the
simulator's step-time model is fitted to these replicas (``bench/calibrate_sim.py``, both probed at once); after
them, the same runs on simulated replicas so calibrated (whole prefills, the model's tokenizer, real time) give the
simulator's prediction, printed beside the engine's. Every line says the machine's load average: the cores are
shared, so compare ratios within one run, never absolute times across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import routing_http
from calibrate_sim import STEP_FIELDS, Probes, calibrate
from routing_lab import contention, knee, placement
from routing_lab.chat import write_replies
from routing_lab.engines import (
    MODEL_LAYERS,
    MODEL_NAME,
    SIM_TIME_SCALE,
    EngineShape,
    Fleet,
    attach_fleet,
    start_fleet,
)
from routing_lab.processes import Processes

from terminus_env.serving.sim.engine import SimConfig

SHAPE = EngineShape()
QUICK_SIM_TIME_SCALE = 0.25  # quick: the simulated replicas at 4 times real time (their lag is printed with each row)
QUICK_MODEL_LAYERS = 1  # quick: the tiny model cut to one layer, which decodes half again as fast
# The calibration's probes for these replicas: prompts and batches inside their context and KV pool, decode batches
# up to what a run holds.
PROBES = Probes(prefill_prompts=(128, 512, 1024, 2048, 3000), decode_shapes=((1, 256), (16, 256), (48, 256), (96, 64),
                (1, 2000), (8, 1000)), decode_outputs=(8, 72), repeats=2, overflow=1.5, overflow_output=256)
# quick: fewer probes, each once and shorter (the fit's every step still runs, on fewer samples)
QUICK_PROBES = Probes(prefill_prompts=(128, 1024, 3000), decode_shapes=((1, 256), (16, 256), (96, 64), (8, 1000)),
                      decode_outputs=(8, 40), repeats=1, overflow=1.5, overflow_output=64)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=("knee", "placement", "quick"))
    parser.add_argument("--no-sim", action="store_true", help="skip the calibration and the simulator's prediction")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--figure", type=Path, help="knee: throughput and preemptions against concurrency (PNG)")
    parser.add_argument("--logs", type=Path, help="keep the replicas' logs and the model here")
    parser.add_argument("--replica-url", action="append", default=[],
                        help="a replica already running in the benchmark's shape (routing_lab.engines.EngineShape), "
                             "once per replica: measured instead of starting new ones, and left running")
    parser.add_argument("--replica-logs", type=Path, help="with --replica-url: those replicas' serve --log-dir")
    parser.add_argument("--limits", help="knee: comma-separated admission limits")
    parser.add_argument("--workloads", default="steady,growing", help="knee: steady and/or growing")
    parser.add_argument("--warmup", type=float, help="knee: seconds before the counters are first read")
    parser.add_argument("--window", type=float, help="knee: seconds measured")
    parser.add_argument("--seeds", default=",".join(map(str, placement.SEEDS)), help="placement: workload seeds")
    parser.add_argument("--report", type=Path, metavar="JSON", help="print (and draw) an earlier run's --json")
    parser.add_argument("--rows", nargs="*", default=[], help="placement: only rows whose label or cap holds a text")
    parser.add_argument("--engine-from", type=Path, metavar="JSON",
                        help="take vLLM's side from an earlier run's --json (the replicas still start, for the "
                             "calibration); only the simulator's side runs")
    parser.add_argument("--calibration-from", type=Path, metavar="JSON",
                        help="the simulator as an earlier run's --json fitted it, instead of fitting it again")
    args = parser.parse_args(argv)
    if bool(args.replica_url) != bool(args.replica_logs):
        parser.error("--replica-url and --replica-logs go together")
    started = time.perf_counter()
    quick = args.what == "quick"
    names = ("steady",) if quick else tuple(n for n in args.workloads.split(",") if n)
    if not names or set(names) - {"steady", "growing"}:
        parser.error(f"--workloads takes steady and/or growing, not {args.workloads!r}")
    limits = tuple(int(x) for x in args.limits.split(",")) if args.limits else \
        knee.QUICK_LIMITS if quick else knee.LIMITS
    seeds = (0,) if quick else tuple(int(x) for x in args.seeds.split(","))
    chosen = placement.rows(args.rows)
    if args.report:
        out = json.loads(args.report.read_text())
    else:
        with tempfile.TemporaryDirectory(prefix="engines-") as tmp:
            work = args.logs or Path(tmp)
            work.mkdir(parents=True, exist_ok=True)
            out = run(work, args.what, names, limits, seeds, chosen, quick, not args.no_sim, args)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    if "knee" in out:
        print(knee.report(out["knee"]))
    if "placement" in out:
        print(placement.report(out["placement"]))
    print(f"load average: {out['load_average_start']:.1f} after the replicas started, {out['load_average_end']:.1f} "
          "at the end")
    if args.figure and "knee" in out:
        knee.figure(args.figure, out["knee"])
    print(f"bench/engines.py {args.what}: {time.perf_counter() - started:.0f} s wall, load average "
          f"{os.getloadavg()[0]:.1f} now")
    return 0


def run(work: Path, what: str, names: Sequence[str], limits: Sequence[int], seeds: Sequence[int],
        chosen: Sequence[routing_http.Row], quick: bool, with_sim: bool, args: argparse.Namespace) -> dict:
    parts: dict[str, float] = {}  # each part's seconds, in the order they ran
    clock = [time.perf_counter()]

    def part(name: str) -> None:
        now = time.perf_counter()
        parts[name] = parts.get(name, 0.0) + now - clock[0]
        clock[0] = now

    layers = QUICK_MODEL_LAYERS if quick else MODEL_LAYERS
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start; {SHAPE.replicas} vLLM CPU replicas "
          f"of the tiny model, {SHAPE.num_blocks} blocks of {SHAPE.block_size} tokens each", flush=True)
    if args.replica_url:
        served, fleet = None, attach_fleet(args.replica_url, args.replica_logs, SHAPE)
        print(f"replicas found running at {', '.join(fleet.urls)}, serving {fleet.model_dir}", flush=True)
    else:
        served, fleet = start_fleet(work, SHAPE, layers)
    part("start")
    out: dict = {"shape": dataclasses.asdict(SHAPE), "startup_s": fleet.startup_s,
                 "kv_check": {**dataclasses.asdict(fleet.kv), "vllm_bytes_per_token": fleet.kv.vllm_bytes_per_token},
                 "load_average_start": os.getloadavg()[0]}  # fmt: skip
    model_layers = json.loads((fleet.model_dir / "config.json").read_text())["num_hidden_layers"]
    print(f"replicas ready in {fleet.startup_s:.0f} s, the model {model_layers} layer(s); KV bytes per token "
          f"{fleet.kv.config_bytes_per_token} from the model's config, {fleet.kv.vllm_bytes_per_token:.1f} from vLLM "
          f"({fleet.kv.kv_memory_bytes} bytes cut into {fleet.kv.profiled_blocks} blocks of {fleet.kv.block_size} "
          f"before the override); {fleet.blocks} blocks reported", flush=True)
    sim_scale = QUICK_SIM_TIME_SCALE if quick else SIM_TIME_SCALE
    calibrated: SimConfig | None = None
    engine_knee: dict = {}
    engine_runs: list = []
    try:
        plan = knee.prepare(fleet, names, limits, quick, args.warmup, args.window) if what != "placement" else None
        live = placement.base_setup(fleet, quick) if what != "knee" else None
        if plan is not None:
            for name in plan.names:
                f = plan.formulas[name]
                print(f"knee, {name}: mean final trace {f.mean_trace_tokens:.0f} tokens (last phase "
                      f"{plan.mean_trace_last_phase[name]:.0f}); x = {f.x:.2f} per replica, x × DP = {f.knee:.1f}, "
                      f"the formula's cap {f.cap}", flush=True)
        part("workloads")
        if with_sim and args.calibration_from:
            out["calibration"] = json.loads(args.calibration_from.read_text())["calibration"]
            calibrated = SimConfig(**out["calibration"]["config"])
        elif with_sim:
            steady = plan if plan is not None and "steady" in plan.names else \
                knee.prepare(fleet, ("steady",), limits, quick, args.warmup, args.window)
            calibrated, out["calibration"] = fit(fleet, QUICK_PROBES if quick else PROBES, steady.chats["steady"][0],
                                                 quick)  # fmt: skip
            part("calibration")
        if args.engine_from:
            earlier = json.loads(args.engine_from.read_text())
            out["engine_from"] = {"file": str(args.engine_from), "load_average_start": earlier["load_average_start"],
                                  "load_average_end": earlier["load_average_end"]}  # fmt: skip
            if plan is not None:
                engine_knee = {name: [knee.revive(p) for p in earlier["knee"]["workloads"][name]["engine"]]
                               for name in plan.names}  # fmt: skip
            if live is not None:
                engine_runs = [r for r in map(placement.revive, earlier["placement"]["runs"]) if r.side == "vLLM"]
        elif plan is not None:
            engine_knee = knee.run_side(plan, fleet.urls, 1.0, "vLLM", fleet.extra)
            part("knee on vLLM")
        if live is not None and not args.engine_from:
            print(f"placement: {live.workload.steps} steps x {live.workload.batch_size} prompts x "
                  f"{live.workload.group_size} rollouts, {live.async_steps} steps in flight; fixed cap "
                  f"{routing_http.fixed_limit(live, routing_http.workload(live)[1])}; "
                  f"{live.token_ratio:.2f} tokens per planned token", flush=True)
            for seed in seeds:
                engine_runs += placement.run_seed(live, seed, chosen, "vLLM", work)
            part("placement on vLLM")
    finally:
        if served is not None:
            served.stop()
    if plan is not None:
        sim_knee = {}
        for name in plan.names if calibrated is not None else ():  # each workload's rollout ids have its replies
            replies = write_replies(plan.chats[name], work / f"knee-replies-{name}.jsonl")
            with Processes(work) as procs:
                urls = procs.replicas(SHAPE.replicas, calibrated, sim_scale, replies, MODEL_NAME,
                                      tokenizer=fleet.model_dir, weight_sync=True)  # fmt: skip
                sim_knee |= knee.run_side(plan, urls, sim_scale, "sim", fleet.extra, [name])
        out["knee"] = {"shape": out["shape"], **knee.results(plan, engine_knee, sim_knee)}
        part("knee on the simulator")
    if live is not None:
        sim_runs = placement.run_sim(live, fleet, calibrated, seeds, chosen, work, sim_scale) \
            if calibrated is not None else []
        out["placement"] = placement.results(engine_runs, sim_runs, live)
        part("placement on the simulator")
    out["load_average_end"] = os.getloadavg()[0]
    out["part_s"] = parts
    print("parts: " + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in parts.items())
          + f" (load average {out['load_average_end']:.1f})", flush=True)
    return out


def fit(fleet: Fleet, probes: Probes, steady: Sequence, quick: bool) -> tuple[SimConfig, dict]:
    """The simulator fitted to the fleet, in the fleet's shape: the step-time model from isolated probes (every
    replica probed at once, each request as the runs send it, the random model kept to the workload's words), then
    what the shared host adds under load, from the ``steady`` stream at a few limits (``routing_lab/contention.py``)."""
    result = asyncio.run(calibrate(fleet.urls, MODEL_NAME, fleet.shape.max_num_seqs, fleet.shape.max_num_batched_tokens,
                                   probes, chunked_prefill=False, extra=fleet.extra, together=True))  # fmt: skip
    config = fleet.shape.sim_config(result["config"])
    check = result["recompute"]
    print(f"calibrated ({os.getloadavg()[0]:.1f} load): " + ", ".join(f"{k} {getattr(config, k):.3g}"
                                                                       for k in STEP_FIELDS)
          + f"; recompute check: vLLM {check.live_s:.2f} s with {check.live_preemptions:.0f} preemptions, simulated "
          f"{check.sim_s:.2f} s with {check.sim_preemptions}", flush=True)  # fmt: skip
    runs = contention.measure(fleet.urls, steady, contention.QUICK_LIMITS if quick else contention.LIMITS,
                              contention.QUICK_WINDOW if quick else contention.WINDOW, fleet.extra)  # fmt: skip
    points = [contention.load_point(p, config, fleet.shape.replicas, result["http_overhead_s"]) for p in runs]
    config = contention.fit(points, config)
    print("the shared host under load (vLLM's figures; the simulator's step × 'x step', plus 'outside'):\n"
          + contention.describe(points), flush=True)
    return config, {"config": dataclasses.asdict(config), "http_overhead_s": result["http_overhead_s"],
                    "samples": [dataclasses.asdict(x) for x in result["samples"]], "residuals": result["residuals"],
                    "recompute": dataclasses.asdict(check), "contention": [dataclasses.asdict(p) for p in points],
                    "contention_runs": [dataclasses.asdict(p) for p in runs], "load_average": os.getloadavg()[0]}



if __name__ == "__main__":
    sys.exit(main())
