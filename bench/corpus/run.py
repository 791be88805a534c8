"""Run the materialised corpus (bench/corpus/materialise.py) through the env and tabulate the false flags.

For each task: the oracle (its own solution typed by the policy) twice in train mode, the no-op (the task
declared done at once) once in train mode, and the oracle once in eval mode, each its own episode. A train
run that ends `tampered`, or any run whose grade lists tamper findings, is a false flag: the oracle and the
no-op never touch the verifier's runtime. Writes the runs and the table as JSON and markdown.

    python bench/corpus/run.py [--tasks .corpus/tasks] [--jobs 2] [--name X ...] [--json F] [--markdown F]
                               [--checkout PATH]

`--checkout PATH` plays the same materialised tasks with another checkout's terminus_env (its .venv's Python when
it has one), e.g. a branch with other watch rules; the JSON records which checkout and commit ran.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from materialise import load_corpus  # beside this script

if TYPE_CHECKING:
    from terminus_env.tasks import Task

HERE = Path(__file__).resolve().parent
CHECKOUT_ENV = "TERMINUS_CORPUS_CHECKOUT"
"""Set when run.py re-runs itself under another checkout's interpreter: that checkout's path."""
DEFAULT_TASKS = HERE.parent.parent / ".corpus" / "tasks"
RUNS = (("train-oracle-1", "train", "oracle"), ("train-oracle-2", "train", "oracle"), ("train-nop", "train", "nop"),
        ("eval-oracle", "eval", "oracle"))  # fmt: skip
EXPECTED = {"oracle": 1.0, "nop": 0.0}
FIRST_PATHS = 3


@dataclass
class RunRecord:
    task: str
    run: str
    mode: str
    policy: str
    reward: float | None
    end_reason: str | None
    tampering: list[dict[str, str]] = field(default_factory=list)
    error: str | None = None
    grade_reason: str | None = None
    failure: str | None = None
    wall_s: float = 0.0

    @property
    def false_flag(self) -> bool:
        return bool(self.tampering) or self.end_reason == "tampered"

    @property
    def as_expected(self) -> bool:
        return self.reward == EXPECTED[self.policy] and not self.false_flag


async def run_task(task: Task, image_ok: str | None) -> list[RunRecord]:
    from terminus_env.rollout import NopPolicy, OraclePolicy, RolloutRunner
    from terminus_env.rollout.policy import Policy, Rollout

    records = []
    for run, mode, kind in RUNS:
        if image_ok is not None:
            records.append(RunRecord(task.name, run, mode, kind, None, None, error=image_ok))
            continue
        policy: Policy = OraclePolicy() if kind == "oracle" else NopPolicy()
        runner = RolloutRunner(policy, env_kwargs={"mode": mode}, max_sandboxes=1)
        trajectory = await runner.run_one(Rollout(f"{task.name}-{run}", task.name, task))
        summary = trajectory.summary
        records.append(RunRecord(
            task.name, run, mode, kind,
            None if summary is None else summary.reward,
            None if summary is None else str(summary.end_reason.value),
            [] if summary is None else [dict(f) for f in summary.tampering],
            trajectory.error or (None if summary is None else summary.error),
            None if summary is None else summary.grade_reason,
            None if summary is None else summary.failure,
            round(trajectory.wall_s, 1),
        ))  # fmt: skip
        last = records[-1]
        flag = " FALSE FLAG" if last.false_flag else ""
        print(f"  {task.name:<45} {run:<15} reward={last.reward} end={last.end_reason}{flag} "
              f"({last.wall_s:.0f}s, load {os.getloadavg()[0]:.1f})", flush=True)  # fmt: skip
    return records


async def run_corpus(folders: list[Path], jobs: int) -> list[RunRecord]:
    from terminus_env.tasks import load_task
    from terminus_env.tasks.task import task_image

    semaphore = asyncio.Semaphore(jobs)

    async def one(folder: Path) -> list[RunRecord]:
        async with semaphore:
            try:
                task = load_task(folder)
            except Exception as exc:  # a task that does not load is reported, the run goes on
                problem = f"load: {' '.join(str(exc).split())[:400]}"
                print(f"  {folder.name}: {problem}", flush=True)
                return [RunRecord(folder.name, run, mode, kind, None, None, error=problem) for run, mode, kind in RUNS]
            try:
                await task_image(task)
                problem = None
            except Exception as exc:  # a task whose image does not build is reported, the run goes on
                problem = f"image: {' '.join(str(exc).split())[:400]}"
                print(f"  {task.name}: {problem}", flush=True)
            return await run_task(task, problem)

    results = await asyncio.gather(*(one(f) for f in folders))
    return [r for task_runs in results for r in task_runs]


def classes_of(folder: Path) -> list[str]:
    record = folder / "adaptations.json"
    return json.loads(record.read_text()).get("classes", []) if record.is_file() else []


def markdown(records: list[RunRecord], classes: dict[str, list[str]], load: tuple[float, ...],
             checkout: dict[str, str | None]) -> str:  # fmt: skip
    commit = (checkout["commit"] or "no commit")[:12] + (" (modified)" if checkout["modified"] else "")
    lines = [f"terminus_env of {checkout['folder']} at {commit}; load average at the end: "
             f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f}", ""]  # fmt: skip
    lines += ["## False flags", "", "One row per flagged run and kind: how many files, and the first few.", "",
              "| task | run | kind | files | first paths |", "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in records:
        by_kind: dict[str, list[str]] = {}
        for finding in r.tampering:
            by_kind.setdefault(finding["kind"], []).append(finding["path"])
        for kind, paths in sorted(by_kind.items()):
            shown = ", ".join(f"`{path}`" for path in paths[:FIRST_PATHS])
            lines.append(f"| {r.task} | {r.run} | {kind} | {len(paths)} | {shown} |")
    lines += ["", "## Every run", "",
              "| task | classes | train oracle 1 | train oracle 2 | train no-op | eval oracle |",
              "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    by_task: dict[str, dict[str, RunRecord]] = {}
    for r in records:
        by_task.setdefault(r.task, {})[r.run] = r
    for name, runs in by_task.items():
        cells = [_cell(runs.get(run)) for run, _, _ in RUNS]
        lines.append(f"| {name} | {', '.join(classes.get(name, []))} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _cell(r: RunRecord | None) -> str:
    if r is None:
        return "-"
    if r.reward is None:
        return f"error: {(r.error or '')[:60]}"
    kinds = sorted({f["kind"] for f in r.tampering})
    text = f"{r.reward:g} {r.end_reason}"
    return text + (f" ({', '.join(kinds)})" if kinds else "")


def summary_counts(records: list[RunRecord]) -> dict[str, object]:
    flagged = [r for r in records if r.false_flag]
    kinds: dict[str, int] = {}
    for r in flagged:
        for kind in {f["kind"] for f in r.tampering}:
            kinds[kind] = kinds.get(kind, 0) + 1
    train = [r for r in records if r.mode == "train" and r.reward is not None]
    return {
        "tasks": len({r.task for r in records}),
        "runs": len(records),
        "train_runs": len(train),
        "train_zeroed_tampered": sum(1 for r in train if r.end_reason == "tampered"),
        "train_oracle_runs": sum(1 for r in train if r.policy == "oracle"),
        "train_oracle_tampered": sum(1 for r in train if r.policy == "oracle" and r.end_reason == "tampered"),
        "train_nop_tampered": sum(1 for r in train if r.policy == "nop" and r.end_reason == "tampered"),
        "tasks_with_a_false_flag": sorted({r.task for r in flagged}),
        "runs_flagged_by_kind": kinds,
        "eval_oracle_not_1": sorted(r.task for r in records if r.run == "eval-oracle" and r.reward != 1.0),
    }


def run_under(checkout: Path, argv: list[str]) -> int:
    """Run this script again with `checkout`'s terminus_env first on the import path (and its .venv's Python)."""
    checkout = checkout.resolve()
    if not (checkout / "terminus_env" / "__init__.py").is_file():
        print(f"error: {checkout} is no checkout of terminus-env (no terminus_env/ package there)", file=sys.stderr)
        return 2
    python = checkout / ".venv" / "bin" / "python"
    interpreter = str(python) if python.is_file() else sys.executable
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(checkout), os.environ.get("PYTHONPATH")])))
    env[CHECKOUT_ENV] = str(checkout)
    return subprocess.run([interpreter, str(Path(__file__).resolve()), *argv], env=env, check=False).returncode


def checkout_record() -> dict[str, str | None]:
    """Which terminus_env played the corpus: its folder and, where it is a git checkout, its commit."""
    import terminus_env

    folder = Path(terminus_env.__file__).resolve().parent.parent
    head = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    dirty = subprocess.run(["git", "-C", str(folder), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, check=False)  # fmt: skip
    commit = head.stdout.strip() or None
    return {"folder": str(folder), "commit": commit, "modified": bool(dirty.stdout.strip()) if commit else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=Path, default=DEFAULT_TASKS, help="materialised tasks (default .corpus/tasks)")
    parser.add_argument("--jobs", type=int, default=2, help="tasks at once (each runs its four episodes in turn)")
    parser.add_argument("--name", action="append", help="only this task (repeatable)")
    parser.add_argument("--json", type=Path, default=None, help="write the runs here (default: beside the tasks)")
    parser.add_argument("--markdown", type=Path, default=None, help="write the tables here (default: beside them)")
    parser.add_argument(
        "--checkout",
        type=Path,
        default=None,
        help="play them with this checkout's terminus_env (default: the one installed here)",
    )
    raw = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(raw)
    if args.checkout is not None and os.environ.get(CHECKOUT_ENV) != str(args.checkout.resolve()):
        return run_under(args.checkout, raw)
    if not args.tasks.is_dir():
        print(f"error: no materialised corpus at {args.tasks}: run `make corpus-tasks` first", file=sys.stderr)
        return 2
    folders = sorted(p for p in args.tasks.iterdir() if p.is_dir() and (not args.name or p.name in args.name))
    for name, value in load_corpus().host_env.items():  # what task.toml templates ask of the host
        os.environ.setdefault(name, value)
    try:
        from terminus_env.rollout import NopPolicy, OraclePolicy, RolloutRunner  # noqa: F401
    except ImportError as exc:
        print(f"error: this terminus_env cannot play the corpus ({exc}): it needs the rollout runner and the oracle "
              "and no-op policies of a checkout that has bench/corpus", file=sys.stderr)  # fmt: skip
        return 2
    started = time.monotonic()
    checkout = checkout_record()
    print(f"{len(folders)} tasks, {len(RUNS)} runs each, {args.jobs} at once, terminus_env of {checkout['folder']} "
          f"at {(checkout['commit'] or 'no commit')[:12]}{' (modified)' if checkout['modified'] else ''} "
          f"(load {os.getloadavg()[0]:.1f})")  # fmt: skip
    records = asyncio.run(run_corpus(folders, args.jobs))
    load = os.getloadavg()
    classes = {f.name: classes_of(f) for f in folders}
    counts = summary_counts(records)
    out_json = args.json or args.tasks.parent / "corpus-runs.json"
    out_md = args.markdown or args.tasks.parent / "corpus-runs.md"
    out_json.write_text(json.dumps({"checkout": checkout, "load": load, "elapsed_s": round(time.monotonic() - started),
                                    "summary": counts, "classes": classes,
                                    "runs": [asdict(r) | {"false_flag": r.false_flag} for r in records]},
                                   indent=2) + "\n")  # fmt: skip
    out_md.write_text(markdown(records, classes, load, checkout))
    print(json.dumps(counts, indent=2))
    print(f"wrote {out_json} and {out_md} ({time.monotonic() - started:.0f}s, load {load[0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
