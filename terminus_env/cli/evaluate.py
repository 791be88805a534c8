"""``terminus-env eval``: run a task suite through the env, streaming results to disk, then score it.

Lenient by default, like Terminal-Bench, so scores compare with public results; ``--strict``
applies the training semantics, as do SWE_EVAL_STRICT_FORMAT and SWE_EVAL_STRICT_TRUNCATION each for its half.
The strictness is resolved once, here, handed to every env and recorded in the run file. ``--oracle`` replaces
the model with each task's solution, which checks the env end to end; ``--sim N`` serves that oracle from N
simulated vLLM replicas through the serving pool, which checks the whole rollout path (routing, HTTP, token
accounting) as well; ``--flaky-oracle SEED`` solves some tasks some of the time, to see the statistics at work.

A run made to last hours: a task that does not load or build is a row with its error and the run
goes on; each rollout is written to the run file as it ends (and to a Harbor job folder, for the
ecosystem's tools: see :mod:`terminus_env.records.harbor_job`), and ``--resume`` continues a run that
was interrupted, skipping the rollouts already in the file. ``--ray ADDRESS`` runs the sandboxes on
the nodes of that Ray cluster instead of this machine's Docker engine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Iterable, Sequence
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from terminus_env.audit.screen import Hackable, Screen, load_screen
from terminus_env.config import EVAL_STRICT_FORMAT, EVAL_STRICT_TRUNCATION, ConfigError
from terminus_env.errors import TerminusError
from terminus_env.protocol.strictness import Strictness
from terminus_env.records import stats
from terminus_env.records.atif import agent_spec
from terminus_env.records.harbor_job import HarborJob, JobFolderError
from terminus_env.records.progress import Progress, Tally
from terminus_env.records.report import STAGE_FAILED, build_report, print_report
from terminus_env.records.run_log import (
    RolloutRecord,
    RunConfig,
    RunContents,
    RunLog,
    TaskErrorRecord,
    TaskStage,
    read_run,
)
from terminus_env.rollout.policy import FlakyOraclePolicy, OraclePolicy, OracleReplies, Policy, Rollout, ServingPolicy
from terminus_env.rollout.runner import RolloutRunner
from terminus_env.rollout.summarize import SummarizeConfig, effective_threshold
from terminus_env.rollout.trajectory import Trajectory
from terminus_env.sandbox import SandboxError
from terminus_env.tasks import Task, TaskError, load_task, task_image
from terminus_env.tasks.loader import task_dirs

_SETTLE_S = 60.0
"""How long an interrupted eval waits for Docker calls in flight before it exits."""
RUNS_DIR = Path("runs")
"""Where a run file goes when ``--run-file`` is not given."""
EXIT_INTERRUPTED = 130
_LENIENT = Strictness(strict_format=False, strict_truncation=False)


def main(args: argparse.Namespace) -> int:
    sources = [bool(args.oracle), bool(args.base_url), bool(args.sim), args.flaky_oracle is not None]
    if sum(sources) != 1:
        print("eval needs exactly one of: --base-url URL (with --model NAME), --oracle, --sim N, --flaky-oracle SEED",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.trials < 1 or args.concurrency < 1:
        print("--trials and --concurrency must be at least 1", file=sys.stderr)
        return 2
    if args.resume and args.run_file is None:
        print("--resume needs --run-file RUN.jsonl: the run file of the run to continue", file=sys.stderr)
        return 2
    problem = _check_limits(args)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    try:  # resolved here, once: the env is handed both switches, and the run file records what it ran
        asked = True if args.strict else None
        strictness = Strictness.from_env("eval", strict_format=asked, strict_truncation=asked)
    except ConfigError as exc:
        print(f"terminus-env: {exc}", file=sys.stderr)
        return 2
    paths = task_dirs(Path(args.folder), list(args.name or ()) or None)  # a wrong folder or name: exit 2, nothing run
    screen = load_screen(getattr(args, "audit_report", None), getattr(args, "hackable", Hackable.SKIP))
    hackable = {} if screen is None else {p.name: screen.mark(p.name) or "" for p in paths if screen.mark(p.name)}
    if screen is not None:
        paths = [p for p in paths if screen.keeps(p.name)]
        print(_screened(screen, hackable, [p.name for p in paths]), flush=True)
        if not paths:
            print("eval: no task is left to play", file=sys.stderr)
            return 2
    config = RunConfig(
        folder=str(Path(args.folder).resolve()),
        names=tuple(args.name or ()),
        trials=args.trials,
        policy=_policy_name(args),
        strict_format=strictness.strict_format,
        strict_truncation=strictness.strict_truncation,
        max_turns=args.max_turns,
        max_turn_tokens=args.max_turn_tokens,
        sampling=_sampling(args),
        summarize=strictness == _LENIENT and not args.no_summarize,  # the env summarizes in lenient eval only
        summarize_threshold=args.summarize_threshold,
        context_window=args.context_window or _served_context_window(args),
        hackable=hackable,
        hackable_policy=None if screen is None else screen.hackable.value,
        audit_report=None if screen is None else screen.source,
    )
    path = args.run_file or RUNS_DIR / f"eval-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}.jsonl"
    if args.resume:
        log, previous = RunLog.resume(path)
        differences = config.differences(previous.config)
        if differences:
            log.close()
            print(f"cannot resume {path} with other options ({'; '.join(differences)}): resume with the run's own "
                  f"options{_strictness_hint(config, previous.config)}, or start a new run with another --run-file",
                  file=sys.stderr)  # fmt: skip
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
    print(f"eval: {_settings(config)}", flush=True)
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


def _screened(screen: Screen, hackable: dict[str, str], kept: Sequence[str]) -> str:
    """What the audit report did to the run, in a line."""
    unaudited = screen.unaudited(kept)
    tail = f"; not in the report (not audited): {', '.join(unaudited)}" if unaudited else ""
    if not hackable:
        return f"eval: the audit report {screen.source} found none of these tasks hackable{tail}"
    named = ", ".join(f"{name} ({why})" for name, why in hackable.items())
    if screen.hackable is Hackable.SKIP:
        return f"eval: left out as hackable by the audit report {screen.source}: {named}{tail}"
    return f"eval: played and marked as hackable by the audit report {screen.source}: {named}{tail}"


def turn_tokens(config: RunConfig) -> int:
    """The per-turn token limit each request asks for: ``--max-turn-tokens``, at most the model's context (a server
    refuses a ``max_tokens`` above it)."""
    window = config.context_window
    return config.max_turn_tokens if window is None else min(config.max_turn_tokens, window)


def _settings(config: RunConfig) -> str:
    """What the run sends and when it summarizes, in a line."""
    turns = "no turn cap" if config.max_turns is None else f"at most {config.max_turns} turns"
    sampling = ", ".join(f"{k}={v}" for k, v in config.sampling.items()) or "the server's default sampling"
    window = config.context_window
    if not config.summarize:
        summary = "no summarization (a full context ends the episode)"
    elif window is None or config.summarize_threshold == 0:
        summary = "summarization when the server refuses a request for its length"
    else:
        summary = (f"summarization under {effective_threshold(config.summarize_threshold, window)} free tokens of "
                   f"{window}, or when the server refuses a request")  # fmt: skip
    return f"{config.strictness.label}, {turns}, {sampling}, {summary}"


def _strictness_hint(now: RunConfig, then: RunConfig) -> str:
    """How to get the run's strictness back, when that is what differs."""
    if now.strictness == then.strictness:
        return ""
    return (f" (it ran {then.strictness.label}: {EVAL_STRICT_FORMAT}={int(then.strict_format)} "
            f"{EVAL_STRICT_TRUNCATION}={int(then.strict_truncation)}, or --strict where both are 1)")  # fmt: skip


def _check_limits(args: argparse.Namespace) -> str | None:
    """What is wrong with the numeric options, or None."""
    for name, value, least in [("--max-turns", args.max_turns, 1), ("--max-turn-tokens", args.max_turn_tokens, 1),
                               ("--summarize-threshold", args.summarize_threshold, 0),
                               ("--context-window", args.context_window, 1)]:  # fmt: skip
        if value is not None and value < least:
            return f"{name} must be at least {least}, got {value}"
    return None


def _sampling(args: argparse.Namespace) -> dict[str, Any]:
    """The sampling parameters to send: only those asked for, as Harbor 0.26 sends none by default."""
    sampling: dict[str, Any] = {}
    for item in args.sampling or ():
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise SamplingError(f"--sampling {item!r}: write KEY=VALUE, e.g. --sampling top_k=20")
        try:
            sampling[key.strip()] = json.loads(raw)
        except ValueError:
            raise SamplingError(f"--sampling {item!r}: the value must be JSON (a number, true, a quoted string)") \
                from None
    named = {"temperature": args.temperature, "top_p": args.top_p}
    sampling.update({key: value for key, value in named.items() if value is not None})
    reserved = sorted(set(sampling) & _RESERVED_REQUEST_KEYS)
    if reserved:
        raise SamplingError(f"--sampling cannot set {', '.join(reserved)}: the eval sets it (see --max-turn-tokens)")
    return sampling


class SamplingError(TerminusError, ValueError):
    """A sampling option the eval cannot send; the message says how to write it."""


_RESERVED_REQUEST_KEYS = {"model", "messages", "max_tokens", "max_completion_tokens", "logprobs", "return_token_ids",
                          "stream"}  # fmt: skip


def _served_context_window(args: argparse.Namespace) -> int | None:
    """The model's context: what the first server reports, the simulated replicas' own, or None (no model)."""
    if args.base_url:
        from terminus_env.serving.client import served_context_window

        return asyncio.run(served_context_window(args.base_url[0], args.model))
    if args.sim:
        from terminus_env.serving.sim.engine import SimConfig

        return SimConfig().max_model_len
    return None


def _resume_hint(path: Path) -> str:
    return (f"{len(read_run(path).rollouts)} finished rollouts are saved in {path}; continue with the same options "
            f"and --run-file {path} --resume")  # fmt: skip


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
        "max_turn_tokens": turn_tokens(config),
        "strict_format": config.strict_format,
        "strict_truncation": config.strict_truncation,
    }
    summarize = SummarizeConfig(enabled=config.summarize, threshold=config.summarize_threshold,
                                context_window=config.context_window)  # fmt: skip
    builds, slots = asyncio.Semaphore(args.concurrency), asyncio.Semaphore(args.concurrency)
    async with _policy(args, config, tasks) as policy, _sandbox_pool(args) as sandbox_pool:
        runner = RolloutRunner(policy, env_kwargs=env_kwargs, sandbox_pool=sandbox_pool,
                               max_sandboxes=args.concurrency, summarize=summarize)  # fmt: skip

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
    threads = [t for t in asyncio.all_tasks()
               if getattr(t.get_coro(), "__qualname__", None) == asyncio.to_thread.__qualname__]  # fmt: skip
    if threads:
        await asyncio.wait(threads, timeout=_SETTLE_S)


def _task_failed(
    name: str, category: str | None, stage: TaskStage, exc: Exception, slots: int, log: RunLog, progress: Progress
) -> None:
    error = f"{type(exc).__name__}: {exc}"
    log.append(TaskErrorRecord(task=name, stage=stage, error=error, category=category))
    label = f"{name}: {STAGE_FAILED[stage]} ({slots} trials not run): {error.splitlines()[0]}"
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
        env_error=trajectory.masked,
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
async def _policy(args: argparse.Namespace, config: RunConfig, tasks: Sequence[Task]) -> AsyncIterator[Policy]:
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
        yield ServingPolicy(pool, max_tokens=turn_tokens(config), sampling=config.sampling)


@contextlib.asynccontextmanager
async def _oracle_server(tasks: Sequence[Task]) -> AsyncIterator[str]:
    """A simulated vLLM replica on a free local port whose 'model' replies like the oracle."""
    from terminus_env.serving.sim.server import ServerConfig, SimServer

    async with SimServer(ServerConfig(model="sim"), OracleReplies(tasks)) as server:
        yield server.url
