"""``terminus-env eval``: run a task suite through the env, streaming results to disk, then score it.

Lenient by default, like Terminal-Bench, so scores compare with public results; ``--strict``
applies the training semantics. ``--oracle`` replaces the model with each task's solution, which
checks the env end to end; ``--sim N`` serves that oracle from N simulated vLLM replicas through
the serving pool, which checks the whole rollout path (routing, HTTP, token accounting) as well;
``--flaky-oracle SEED`` solves some tasks some of the time, to see the statistics at work.

A run made to last hours: a task that does not load or build is a row with its error and the run
goes on; each rollout is written to the run file as it ends (and to a Harbor job folder, for the
ecosystem's tools: see :mod:`terminus_env.rollout.harbor_job`), and ``--resume`` continues a run that
was interrupted, skipping the rollouts already in the file. ``--ray ADDRESS`` runs the sandboxes on
the nodes of that Ray cluster instead of this machine's Docker engine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Iterable, Sequence
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from terminus_env.errors import TerminusError
from terminus_env.metrics import aggregate
from terminus_env.rollout import stats
from terminus_env.rollout.atif import agent_spec
from terminus_env.rollout.harbor_job import HarborJob, JobFolderError
from terminus_env.rollout.policy import FlakyOraclePolicy, OraclePolicy, OracleReplies, Policy, Rollout, ServingPolicy
from terminus_env.rollout.progress import Progress, Tally
from terminus_env.rollout.run_log import (
    RolloutRecord,
    RunConfig,
    RunContents,
    RunLog,
    TaskErrorRecord,
    TaskStage,
    read_run,
)
from terminus_env.rollout.runner import RolloutRunner
from terminus_env.rollout.trajectory import Trajectory
from terminus_env.sandbox import SandboxError
from terminus_env.tasks import Task, TaskError, load_task, task_image
from terminus_env.tasks.loader import task_dirs

_STAGE_FAILED = {TaskStage.LOAD: "could not load", TaskStage.IMAGE: "could not build its image"}
_SETTLE_S = 60.0
"""How long an interrupted eval waits for Docker calls in flight before it exits."""
RUNS_DIR = Path("runs")
"""Where a run file goes when ``--output`` is not given."""
EXIT_INTERRUPTED = 130


def main(args: argparse.Namespace) -> int:
    sources = [bool(args.oracle), bool(args.base_url), bool(args.sim), args.flaky_oracle is not None]
    if sum(sources) != 1:
        print("eval needs exactly one of: --base-url URL (with --model NAME), --oracle, --sim N, --flaky-oracle SEED",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.trials < 1 or args.concurrency < 1:
        print("--trials and --concurrency must be at least 1", file=sys.stderr)
        return 2
    if args.resume and args.output is None:
        print("--resume needs --output RUN.jsonl: the run file of the run to continue", file=sys.stderr)
        return 2
    config = RunConfig(
        folder=str(Path(args.folder).resolve()),
        names=tuple(args.name or ()),
        trials=args.trials,
        policy=_policy_name(args),
        strict=bool(args.strict),
        max_turns=args.max_turns,
        max_turn_tokens=args.max_turn_tokens,
    )
    paths = task_dirs(Path(args.folder), list(config.names) or None)  # a wrong folder or name: exit 2, nothing run
    path = args.output or RUNS_DIR / f"eval-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}.jsonl"
    if args.resume:
        log, previous = RunLog.resume(path)
        differences = config.differences(previous.config)
        if differences:
            log.close()
            print(f"cannot resume {path} with other options ({'; '.join(differences)}): resume with the run's own "
                  "options, or start a new run with another --output", file=sys.stderr)  # fmt: skip
            return 2
    else:
        log, previous = RunLog.create(path, config), RunContents(config)
    try:
        job = HarborJob.open(args.jobs_dir / path.stem, agent_spec(config), {p.name: p for p in paths},
                             trials=config.trials, concurrency=args.concurrency, resume=args.resume)  # fmt: skip
    except JobFolderError as exc:
        log.close()
        if not args.resume:
            path.unlink()  # it holds only the header written a moment ago
        print(f"terminus-env: {exc}", file=sys.stderr)
        return 2
    finished = previous.finished()
    total = len(paths) * config.trials
    already = sum(1 for p in paths for i in range(config.trials) if (p.name, i) in finished)
    print(f"eval: {len(paths)} tasks × {config.trials} trials ({config.policy}); each rollout is saved to {path} "
          f"and, in Harbor's job layout, to {job.path}" + (f"; {already} already there" if already else ""),
          flush=True)  # fmt: skip
    progress = Progress(Tally(total=total, done=already))
    started = time.monotonic()
    try:
        asyncio.run(_evaluate(args, config, paths, finished, _Outputs(log, job, progress), progress))
    except KeyboardInterrupt:
        progress.close()
        _finish_job(job, path, paths, finished=False)
        print(f"\ninterrupted: {_resume_hint(path)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except TerminusError as exc:  # e.g. no model replica answers any more: stop, keep what is done
        progress.close()
        _finish_job(job, path, paths, finished=False)
        print(f"\nstopped: {exc}\n{_resume_hint(path)}", file=sys.stderr)
        return 2
    finally:
        progress.close()
        log.close()
    contents = read_run(path)
    report = _finish_job(job, path, paths, finished=True)
    print()
    print_report(report, contents, sys.stdout)
    ran = len(contents.rollouts) - len(previous.rollouts)
    print(f"\n{ran} rollouts run in {time.monotonic() - started:.0f} s; every trajectory is in {path}, and in "
          f"Harbor's job layout in {job.path} (look at one with: terminus-env view {job.path})")  # fmt: skip
    oracle = args.oracle or bool(args.sim)
    unsolved = any(t.solved < t.trials for t in report.tasks)
    return 1 if report.invalid or (oracle and unsolved) else 0


class _Outputs:
    """Where each finished rollout goes: the run file first (the record that counts), then its trial folder in the
    Harbor job, whose failure is reported but never stops the run (the end of the run writes what is missing)."""

    def __init__(self, log: RunLog, job: HarborJob, progress: Progress) -> None:
        self.log, self._job, self._progress = log, job, progress

    def save(self, record: RolloutRecord) -> None:
        self.log.append(record)
        try:
            self._job.add_rollout(record)
        except (OSError, TypeError, ValueError) as exc:
            self._progress.note(f"{record.task} #{record.trial}: its Harbor trial folder was not written ({exc}); "
                                "the run file has the rollout, and the end of the run writes it again")  # fmt: skip


def _finish_job(job: HarborJob, path: Path, paths: Sequence[Path], *, finished: bool) -> stats.Report:
    """Complete the Harbor job from the run file; the run's statistics, for the final table."""
    contents = read_run(path)
    report = build_report(contents, [p.name for p in paths])
    for problem in job.finish(contents, report, finished=finished):
        print(f"Harbor job {job.path}: not written: {problem}; rerun with --resume to write it", file=sys.stderr)
    return report


def _resume_hint(path: Path) -> str:
    return (f"{len(read_run(path).rollouts)} finished rollouts are saved in {path}; continue with the same options "
            f"and --output {path} --resume")  # fmt: skip


def _policy_name(args: argparse.Namespace) -> str:
    if args.flaky_oracle is not None:
        return f"flaky-oracle:{args.flaky_oracle}"
    if args.oracle or args.sim:
        return "oracle"  # served locally or through simulated replicas, the replies are the same
    return f"model:{args.model}"


async def _evaluate(
    args: argparse.Namespace, config: RunConfig, paths: Sequence[Path], finished: set[tuple[str, int]],
    outputs: _Outputs, progress: Progress,
) -> None:  # fmt: skip
    """Load, build and run every task; each result goes to the log and the progress display as it ends."""
    todo: dict[str, list[int]] = {}
    for path in paths:
        todo[path.name] = [i for i in range(config.trials) if (path.name, i) not in finished]
    tasks: list[Task] = []
    for path in paths:
        if not todo[path.name]:
            continue
        try:
            tasks.append(load_task(path))
        except TaskError as exc:
            _task_failed(path.name, None, TaskStage.LOAD, exc, len(todo[path.name]), outputs.log, progress)
    env_kwargs = {
        "mode": "eval",
        "max_turns": config.max_turns,
        "max_turn_tokens": config.max_turn_tokens,
        **({"strict_format": True, "strict_truncation": True} if config.strict else {}),
    }
    builds, slots = asyncio.Semaphore(args.concurrency), asyncio.Semaphore(args.concurrency)
    async with _policy(args, tasks) as policy, _sandbox_pool(args) as sandbox_pool:
        runner = RolloutRunner(
            policy, env_kwargs=env_kwargs, sandbox_pool=sandbox_pool, max_sandboxes=args.concurrency
        )

        async def one(task: Task, trial: int) -> None:
            async with slots:  # taken here, not only in the runner, so "running" counts what runs, not what waits
                progress.started()
                trajectory = await runner.run_one(Rollout(f"{task.name}#{trial}", task.name, task))
            record = rollout_record(task, trial, trajectory)
            outputs.save(record)
            solved = record.reward >= stats.SUCCESS_REWARD
            progress.finished(_progress_label(record), record.reward, error=record.env_error, solved=solved)

        async def run_task(task: Task) -> None:
            async with builds:  # one build per task, before its rollouts, so a broken Dockerfile fails once
                try:
                    await task_image(task, sandbox_pool)
                except (SandboxError, TaskError) as exc:
                    _task_failed(task.name, task.category, TaskStage.IMAGE, exc, len(todo[task.name]), outputs.log,
                                 progress)  # fmt: skip
                    return
            await _all(one(task, trial) for trial in todo[task.name])

        try:
            await _all(run_task(task) for task in tasks)
        except asyncio.CancelledError:  # Ctrl-C: the rollouts are cancelled and closed their sandboxes
            await _settle_threads()
            raise


async def _settle_threads() -> None:
    """Wait for the Docker calls still running in threads (a container being created, say): a thread cannot be
    cancelled, and the sandbox that started it removes what it made only once it returns."""
    threads = [t for t in asyncio.all_tasks() if t.get_coro().__qualname__ == asyncio.to_thread.__qualname__]
    if threads:
        await asyncio.wait(threads, timeout=_SETTLE_S)


def _task_failed(
    name: str, category: str | None, stage: TaskStage, exc: Exception, slots: int, log: RunLog, progress: Progress
) -> None:
    error = f"{type(exc).__name__}: {exc}"
    log.append(TaskErrorRecord(task=name, stage=stage, error=error, category=category))
    label = f"{name}: {_STAGE_FAILED[stage]} ({slots} trials not run): {error.splitlines()[0]}"
    progress.finished(label, 0.0, error=True, solved=False, was_running=False, count=slots)


async def _all(coroutines: Iterable[Awaitable[None]]) -> None:
    """Run all; on the first exception (or cancellation) cancel the rest and wait for them to clean up."""
    pending = [asyncio.ensure_future(c) for c in coroutines]
    try:
        await asyncio.gather(*pending)
    finally:
        for future in pending:
            future.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


def rollout_record(task: Task, trial: int, trajectory: Trajectory) -> RolloutRecord:
    summary = trajectory.summary
    detail = None
    if trajectory.reward < stats.SUCCESS_REWARD:
        if summary is None:
            detail = trajectory.error
        else:
            detail = summary.failure or summary.grade_reason or summary.error
    return RolloutRecord(
        task=task.name,
        trial=trial,
        reward=trajectory.reward,
        end_reason=summary.end_reason if summary else "env_error",
        env_error=trajectory.env_error,
        category=task.category,
        detail=detail,
        wall_s=round(trajectory.wall_s, 3),
        summary=asdict(summary) if summary else None,
        trajectory=trajectory.to_dict(),
    )


def _progress_label(record: RolloutRecord) -> str:
    why = f" · {record.detail.splitlines()[0]}" if record.detail else ""
    return f"{record.task} #{record.trial}: reward {record.reward:g} ({record.end_reason}){why}"


@contextlib.asynccontextmanager
async def _sandbox_pool(args: argparse.Namespace) -> AsyncIterator[Any]:
    """With ``--ray ADDRESS``, sandboxes on that Ray cluster's nodes; else None (this machine's Docker)."""
    if not args.ray:
        yield None
        return
    try:
        from terminus_env.sandbox.fleet import RaySandboxPool
    except ImportError as exc:
        raise SandboxError(str(exc)) from exc
    async with RaySandboxPool(args.ray) as pool:
        yield pool


@contextlib.asynccontextmanager
async def _policy(args: argparse.Namespace, tasks: Sequence[Task]) -> AsyncIterator[Policy]:
    if args.oracle:
        yield OraclePolicy()
        return
    if args.flaky_oracle is not None:
        yield FlakyOraclePolicy(args.flaky_oracle)
        return
    from terminus_env.serving import ServingPool

    async with contextlib.AsyncExitStack() as stack:
        urls = args.base_url or [await stack.enter_async_context(_oracle_server(tasks)) for _ in range(args.sim)]
        pool = await stack.enter_async_context(ServingPool(urls, args.model or "sim"))
        yield ServingPolicy(pool, max_tokens=args.max_turn_tokens)


@contextlib.asynccontextmanager
async def _oracle_server(tasks: Sequence[Task]) -> AsyncIterator[str]:
    """A simulated vLLM replica on a free local port whose 'model' replies like the oracle."""
    from terminus_env.serving.sim.server import ServerConfig, SimServer

    async with SimServer(ServerConfig(model="sim"), OracleReplies(tasks)) as server:
        yield server.url


# --- the final report ----------------------------------------------------------------------------


def build_report(contents: RunContents, task_order: Sequence[str] = ()) -> stats.Report:
    """The statistics of a run file: every rollout, and each missing trial of a broken task as invalid."""
    trials = [
        stats.Trial(r.task, r.reward, r.end_reason, valid=not r.env_error, category=r.category)
        for r in contents.rollouts
    ]
    done: dict[str, int] = {}
    for r in contents.rollouts:
        done[r.task] = done.get(r.task, 0) + 1
    for error in contents.current_task_errors():
        missing = contents.config.trials - done.get(error.task, 0)
        trials += [stats.Trial(error.task, 0.0, f"{error.stage.value}_error", valid=False, category=error.category)
                   for _ in range(missing)]  # fmt: skip
    return stats.report(trials, contents.config.trials, task_order)


def print_report(report: stats.Report, contents: RunContents, out: TextIO) -> None:
    """Per task, per category and overall, then the first failure of each unsolved task."""
    k = report.k
    pass_k = [f"pass@{k}"] if k > 1 else []
    rows = [("task", "category", "trials", "solved", "pass@1", *pass_k, "mean reward", "end reasons")]
    for t in report.tasks:
        ends = ", ".join(f"{reason} ×{n}" for reason, n in t.end_reasons.items())
        rows.append((t.task, t.category or "-", str(t.trials), str(t.solved) if t.trials else "-", _num(t.pass_at_1),
                     *([_num(t.pass_at_k)] if k > 1 else []), _num(t.mean_reward), ends))  # fmt: skip
    _table(rows, out)

    out.write("\n")
    rows = [("category", "tasks", "pass@1", *pass_k, "mean reward ± 95% CI")]
    groups = [(name, score) for name, score in report.categories.items() if score.tasks]
    groups = [*groups, ("overall", report.overall)] if len(groups) > 1 else [("overall", report.overall)]
    for name, score in groups:
        rows.append((name, str(score.tasks), _num(score.pass_at_1), *([_num(score.pass_at_k)] if k > 1 else []),
                     _with_ci(score)))  # fmt: skip
    _table(rows, out)

    failures = _first_failures(contents)
    if failures:
        out.write("\nfirst failure of each unsolved task:\n")
        for name in [t.task for t in report.tasks if t.task in failures]:
            out.write(f"  {name}: {failures[name]}\n")

    overall = report.overall
    out.write(f"\nscore {_with_ci(overall)} over {overall.tasks} tasks: the mean over tasks of each task's mean "
              "reward, as the Terminal-Bench leaderboard computes it\n")  # fmt: skip
    if overall.mean_reward is not None and overall.stderr is None:
        out.write("no confidence interval: it needs 2 valid trials of every task (--trials 2 or more)\n")
    if overall.unscored:
        out.write(f"not scored (no valid trial): {', '.join(overall.unscored)}\n")
    if k > 1 and overall.pass_at_k_tasks < overall.tasks:
        out.write(f"pass@{k} counts the {overall.pass_at_k_tasks} tasks with {k} valid trials\n")
    out.write("end reasons: " + ", ".join(f"{reason} {n}" for reason, n in report.end_reasons.items()) + "\n")
    m = aggregate([r.summary for r in contents.rollouts if r.summary is not None])
    out.write(f"{report.rollouts} rollouts · {report.invalid} invalid (env errors, broken tasks) · format "
              f"errors/rollout {m.mean_format_errors:.2f} · opening streak {m.mean_opening_streak:.2f} · rescued "
              f"{m.rescued_count} · tampered {m.tampered_count}\n")  # fmt: skip
    tampered = [r for r in contents.rollouts if r.summary and r.summary.get("tampering")]
    if tampered:
        out.write("tampered (the verifier ran what the agent changed in its runtime; the scores above keep them):\n")
        for r in tampered:
            paths = ", ".join(f"{f['kind']} {f['path']}".strip() for f in r.summary["tampering"])  # type: ignore[index]
            out.write(f"  {r.task} #{r.trial}: {paths}\n")
    out.flush()


def _first_failures(contents: RunContents) -> dict[str, str]:
    """Per unsolved task, why its first unsolved trial (lowest trial number) failed."""
    failures: dict[str, tuple[int, str]] = {}
    for r in contents.rollouts:
        if r.reward < stats.SUCCESS_REWARD and (r.task not in failures or r.trial < failures[r.task][0]):
            failures[r.task] = (r.trial, f"#{r.trial} {r.end_reason}: {r.detail or 'no detail'}")
    found = {task: text for task, (_, text) in failures.items()}
    for e in contents.current_task_errors():
        found.setdefault(e.task, f"{_STAGE_FAILED[e.stage]}: {_clip(e.error.splitlines()[0])}")
    return found


def _clip(text: str, cap: int = 300) -> str:
    """One line of at most ``cap`` characters, cut between words."""
    text = " ".join(text.split())
    return text if len(text) <= cap else text[: text.rfind(" ", 0, cap)] + " …"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _with_ci(score: stats.Score) -> str:
    if score.mean_reward is None:
        return "-"
    if score.stderr is None or score.ci95 is None:
        return f"{score.mean_reward:.3f} ± n/a"
    low, high = score.ci95
    return f"{score.mean_reward:.3f} ± {stats.Z_95 * score.stderr:.3f} ({low:.3f}–{high:.3f})"


def _table(rows: list[tuple[str, ...]], out: TextIO) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for i, row in enumerate(rows):
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() + "\n")
        if i == 0:
            out.write("  ".join("-" * w for w in widths) + "\n")
