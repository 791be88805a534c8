"""Play the catalogue against a suite: every task's exploits as episodes through the env, many at once on one event
loop, and the report.

Per task: its image is built once; the control (doing nothing) plays first and surveys the container on the way;
then every exploit with something to work on plays in a fresh container, in eval mode, each once (train mode's
verdict follows from the same episode: :mod:`terminus_env.audit.verdict`). ``concurrency`` bounds the episodes in flight
across the whole suite.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TextIO

from terminus_env.audit.catalogue import CATALOGUE, CONTROL, exploit_named
from terminus_env.audit.exploits import Exploit, Plan
from terminus_env.audit.policy import COMMAND_WAIT_S, ExploitPolicy, SurveyPolicy
from terminus_env.audit.report import AuditReport, ExploitResult, TaskAudit, print_report
from terminus_env.audit.survey import Survey
from terminus_env.audit.verdict import Episode, judge_task
from terminus_env.rollout.policy import Policy, Rollout
from terminus_env.rollout.runner import RolloutRunner
from terminus_env.tasks import Task, TaskError, load_task, task_image
from terminus_env.tasks.loader import shipped_tasks_dir, task_dirs

MODE = "eval"
"""The verifier's reward stands and the findings are listed: both verdicts from one episode."""
RETRIES = 1
"""A further try for an episode the infrastructure failed (Docker, a sandbox that did not start) or whose verifier ran
out of time."""


@dataclass(frozen=True)
class Played:
    episode: Episode
    duration_s: float


def run_audit(
    folder: Path | None,
    concurrency: int = 4,
    names: list[str] | None = None,
    output: Path | None = None,
    exploits: list[str] | None = None,
) -> int:
    """``terminus-env tasks audit``: play the catalogue (or only ``exploits``, beside the control) on every task of
    ``folder`` (default: the shipped suite), print the table and write the JSON report to ``output``. Returns the
    exit code: 0 when no task is hackable and the runtime let nothing through, 1 otherwise, 2 for bad arguments."""
    if concurrency < 1:
        print(f"--concurrency must be at least 1, not {concurrency}", file=sys.stderr)
        return 2
    root = shipped_tasks_dir() if folder is None else Path(folder)
    try:
        paths = task_dirs(root, names)
        chosen = select(exploits)
        if output is not None and output.is_dir():
            raise ValueError(f"--report {output} is a folder: name the report's file (report.json)")
    except (TaskError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    done: list[TaskAudit] = []
    names_played = tuple(e.name for e in chosen)

    def finished(audited: TaskAudit) -> None:  # the report so far, on disk as each task ends: a stopped run keeps it
        _printer(sys.stdout)(audited)
        done.append(audited)
        if output is not None:
            partial = f"partial: {len(done)} of {len(paths)} tasks"
            partial_report = AuditReport(str(root.resolve()), names_played, concurrency, 0.0, tasks=tuple(done),
                                         notes=(partial,))  # fmt: skip
            partial_report.save(output)

    report = asyncio.run(audit_suite(paths, concurrency, folder=str(root.resolve()), exploits=chosen,
                                     progress=finished))  # fmt: skip
    print()
    print_report(report, sys.stdout)
    if output is not None:
        report.save(output)
        print(f"report written to {output}")
    clean = all(t.error is None and not t.hackable and not t.runtime_passes for t in report.tasks)
    return 0 if clean else 1


def select(names: Sequence[str] | None) -> tuple[Exploit, ...]:
    """The control and the named exploits, in the catalogue's order (all of it without names)."""
    if not names:
        return CATALOGUE
    wanted = {exploit_named(name).name for name in names}
    return tuple(e for e in CATALOGUE if e is CONTROL or e.name in wanted)


async def audit_suite(
    paths: Sequence[Path],
    concurrency: int,
    *,
    folder: str = "",
    exploits: Sequence[Exploit] = CATALOGUE,
    progress: Callable[[TaskAudit], None] = lambda _: None,
    command_wait_s: float = COMMAND_WAIT_S,
) -> AuditReport:
    """Audit every task folder in ``paths``, at most ``concurrency`` episodes (and image builds) at once."""
    started = time.monotonic()
    slots = asyncio.Semaphore(concurrency)

    async def one(path: Path) -> TaskAudit:
        audited = await audit_task(path, slots, exploits, command_wait_s, started)
        progress(audited)
        return audited

    tasks = await asyncio.gather(*(one(p) for p in paths))
    return AuditReport(
        folder=folder,
        exploits=tuple(e.name for e in exploits),
        jobs=concurrency,
        duration_s=round(time.monotonic() - started, 1),
        load_average=_load_average(),
        tasks=tuple(tasks),
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )


async def audit_task(
    path: Path,
    slots: asyncio.Semaphore,
    exploits: Sequence[Exploit] = CATALOGUE,
    wait_s: float = COMMAND_WAIT_S,
    started: float | None = None,
) -> TaskAudit:
    """One task: its image, the control with the survey, then every exploit that has something to work on.
    ``started`` is when the suite's audit began (its time is counted from there)."""
    started = time.monotonic() if started is None else started
    try:
        task = load_task(path)
        async with slots:
            await task_image(task)
    except Exception as exc:  # a broken task or a failed build fails this task only
        return TaskAudit(path.name, round(time.monotonic() - started, 1), error=_one_line(exc))
    control, rest = exploits[0], exploits[1:]
    surveyor = SurveyPolicy(control, wait_s)
    played = {control.name: await _play(task, surveyor, slots)}
    survey = surveyor.survey or Survey(task.instruction)
    plans: dict[str, Plan] = {}
    for exploit in rest:
        plan = exploit.plan(survey)
        if plan is not None:
            plans[exploit.name] = plan
    runs = [_play(task, ExploitPolicy(e, plans[e.name], wait_s), slots) for e in rest if e.name in plans]
    for exploit, result in zip([e for e in rest if e.name in plans], await asyncio.gather(*runs)):
        played[exploit.name] = result
    targets = {name: plan.targets for name, plan in plans.items()}
    judgements = judge_task(exploits, {name: p.episode for name, p in played.items()}, targets)
    results = []
    for exploit in exploits:
        judgement, run = judgements[exploit.name], played.get(exploit.name)
        episode = run.episode if run else None
        results.append(ExploitResult(
            exploit=exploit.name, channel=exploit.channel, verdict=judgement.verdict,
            targets=targets.get(exploit.name, ()), placement=judgement.placement, fix=judgement.fix,
            eval_reward=episode.reward if episode else None, eval_end_reason=episode.end_reason if episode else None,
            train_reward=judgement.train_reward, train_end_reason=judgement.train_end_reason,
            findings=tuple(dict(f) for f in episode.findings) if episode else (),
            duration_s=round(run.duration_s, 1) if run else 0.0, error=episode.error if episode else None,
            grade_reason=episode.grade_reason if episode else None,
        ))  # fmt: skip
    return TaskAudit(task.name, round(time.monotonic() - started, 1), tuple(results))


async def _play(task: Task, policy: Policy, slots: asyncio.Semaphore) -> Played:
    """One episode in eval mode, tried again once if the infrastructure failed it or its verifier ran out of time.
    Its time counts from when it got its slot."""
    episode, duration = Episode(None, None, error="not played"), 0.0
    for attempt in range(1 + RETRIES):
        async with slots:
            started = time.monotonic()
            runner = RolloutRunner(policy, env_kwargs={"mode": MODE, "confirm_completion": False}, max_sandboxes=1)
            trajectory = await runner.run_one(Rollout(f"audit-{task.name}-{attempt}", task.name, task))
            duration += time.monotonic() - started
        summary = trajectory.summary
        if summary is None:
            episode = Episode(None, None, error=_one_line(trajectory.error or "the episode did not start"))
        else:
            findings = tuple(dict(f) for f in summary.tampering)
            episode = Episode(summary.reward, summary.end_reason.value, findings, summary.error, summary.grade_reason)
        if episode.judged:
            break
    return Played(episode, duration)


def _printer(out: TextIO) -> Callable[[TaskAudit], None]:
    def report(audited: TaskAudit) -> None:
        out.write(f"{audited.task}: {audited.summary()}  ({audited.episodes} episodes in {audited.episode_s:.0f}s, "
                  f"done {audited.duration_s:.0f}s into the audit)\n")  # fmt: skip
        out.flush()

    return report


def _load_average() -> tuple[float, float, float]:
    one, five, fifteen = os.getloadavg()
    return round(one, 2), round(five, 2), round(fifteen, 2)


def _one_line(value: object) -> str:
    return " ".join(str(value).split())
