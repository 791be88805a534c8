"""`terminus-env tasks check` and `tasks list`: is every task in a suite valid?

A task is valid when its oracle (solve.sh, then the verifier, in one container) earns 1 and
doing nothing (a fresh container graded at once) earns 0 -- Terminal-Bench's two checks -- and
when both hold in train mode too: the oracle typed into the terminal by the policy, and an agent
that declares the task done at once, each played through the env, where a verifier run flagged as
tampering ends the episode with reward 0. A flag there is a false one (neither touches the
verifier's runtime), and the check names its finding.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from terminus_env.errors import TerminusError
from terminus_env.tasks.grading import apply_oracle, grade
from terminus_env.tasks.loader import load_task, shipped_tasks_dir, task_dirs
from terminus_env.tasks.task import Task, TaskError, task_image

if TYPE_CHECKING:
    from terminus_env.audit.report import AuditReport
    from terminus_env.sandbox import Sandbox

CHECKS = ("nop", "oracle", "train-nop", "train-oracle")
TRAIN_CHECKS = ("train-nop", "train-oracle")
"""Played through the env in train mode (``TamperPolicy.FAIL``), as a trainer's episodes are."""
_EXPECTED = {"nop": 0.0, "oracle": 1.0, "train-nop": 0.0, "train-oracle": 1.0}


@dataclass(frozen=True)
class CheckOutcome:
    task: str
    check: str
    """One of CHECKS, or "load"/"image" when the task failed before any check could run."""
    reward: float | None
    passed: bool
    duration_s: float
    detail: str = ""


def run_check(
    folder: Path | None, concurrency: int = 4, names: list[str] | None = None, audit: Path | None = None
) -> int:
    """Check the tasks in `folder` (default: the shipped suite; only `names` if given), `concurrency` at once. With
    `audit` (a report of ``tasks audit``), the table shows what the audit found beside the checks; it does not change
    the exit code, which is 0 when every task passes every check.
    """
    if concurrency < 1:
        print(f"--concurrency must be at least 1, not {concurrency}", file=sys.stderr)
        return 2
    try:
        paths = task_dirs(shipped_tasks_dir() if folder is None else Path(folder), names)
        report = None if audit is None else _audit_report(audit)
    except TerminusError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    start = time.monotonic()
    outcomes = asyncio.run(check_tasks(paths, concurrency, _ProgressPrinter(len(CHECKS) * len(paths), sys.stdout)))
    print_outcomes(outcomes, time.monotonic() - start, sys.stdout, report)
    return 0 if outcomes and all(o.passed for o in outcomes) else 1


def _audit_report(path: Path) -> AuditReport:
    from terminus_env.audit.report import AuditReport

    return AuditReport.load(path)


def print_task_table(folder: Path | None = None) -> None:
    """The suite at a glance (default: the shipped one): name, category, difficulty, agent timeout."""
    rows = []
    for path in task_dirs(shipped_tasks_dir() if folder is None else Path(folder)):
        try:
            task = load_task(path)
        except TaskError as exc:
            rows.append((path.name, "BROKEN", "-", str(exc)))
            continue
        timeout = "-" if task.agent_timeout_s is None else f"{task.agent_timeout_s:g}s"
        rows.append((task.name, task.category or "-", task.difficulty or "-", timeout))
    _print_table(("name", "category", "difficulty", "agent timeout"), rows, sys.stdout)


async def check_tasks(
    paths: list[Path], concurrency: int, report: Callable[[CheckOutcome], None] = lambda _: None
) -> list[CheckOutcome]:
    """Both checks for each task; at most `concurrency` tasks (image build included) in flight."""
    semaphore = asyncio.Semaphore(concurrency)

    async def one(path: Path) -> list[CheckOutcome]:
        async with semaphore:
            return await check_task(path, report)

    results = await asyncio.gather(*(one(p) for p in paths))
    return [o for task_outcomes in results for o in task_outcomes]


async def check_task(path: Path, report: Callable[[CheckOutcome], None]) -> list[CheckOutcome]:
    """Load, build, then run every check of CHECKS, each in its own container."""
    start = time.monotonic()
    try:
        task = load_task(path)
        image = await task_image(task)
    except Exception as exc:  # a broken task or a failed build fails this task only
        stage = "load" if isinstance(exc, TaskError) else "image"
        outcome = CheckOutcome(path.name, stage, None, False, time.monotonic() - start, _one_line(exc))
        report(outcome)
        return [outcome]
    outcomes = []
    for check in CHECKS:
        run = run_train_check(task, check) if check in TRAIN_CHECKS else run_one_check(task, image, check)
        outcome = await run
        report(outcome)
        outcomes.append(outcome)
    return outcomes


async def run_one_check(task: Task, image: str, check: str) -> CheckOutcome:
    """A fresh container; the oracle applied if `check` is "oracle"; then graded."""
    from terminus_env.sandbox import Sandbox

    start = time.monotonic()
    sandbox = None
    detail = ""
    try:
        sandbox = await Sandbox.start(task.sandbox_spec(image))
        if check == "oracle":
            detail = await _apply_oracle(sandbox, task)
        result = await grade(sandbox, task)
    except Exception as exc:  # the container or a copy failed: this check fails, the run goes on
        return CheckOutcome(task.name, check, None, False, time.monotonic() - start, _one_line(exc))
    finally:
        if sandbox is not None:
            await sandbox.close()
    passed = result.reward == _EXPECTED[check] and not result.tampering  # the oracle is no cheat: no false alarm
    if result.tampering:
        detail = "; ".join([detail] * bool(detail) + [f"flagged as tampering: {finding.kind} {finding.path} "
                                                        f"({finding.detail})" for finding in result.tampering])
    elif not passed:
        detail = "; ".join(x for x in (detail, result.reason, result.failure or _output_tail(result.output)) if x)
    return CheckOutcome(task.name, check, result.reward, passed, time.monotonic() - start, detail)


async def run_train_check(task: Task, check: str) -> CheckOutcome:
    """One episode through the env in train mode: the oracle typed by the policy, or the task declared done."""
    from terminus_env.rollout import NopPolicy, OraclePolicy, RolloutRunner
    from terminus_env.rollout.policy import Rollout
    from terminus_env.rules import EndReason

    start = time.monotonic()
    policy = OraclePolicy() if check == "train-oracle" else NopPolicy()
    runner = RolloutRunner(policy, env_kwargs={"mode": "train"}, max_sandboxes=1)
    trajectory = await runner.run_one(Rollout(f"check-{check}-{task.name}", task.name, task))
    summary, duration = trajectory.summary, time.monotonic() - start
    if summary is None:
        return CheckOutcome(task.name, check, None, False, duration, _one_line(trajectory.error or "no episode"))
    if summary.end_reason is EndReason.TAMPERED or summary.tampering:
        flags = [f"{f['kind']} {f['path']} ({f['detail']})" for f in summary.tampering]
        return CheckOutcome(task.name, check, summary.reward, False, duration,
                            "flagged as tampering in train mode: " + "; ".join(flags))  # fmt: skip
    passed = summary.graded and summary.reward == _EXPECTED[check]
    why = summary.grade_reason or summary.failure or summary.error or ""
    detail = "" if passed else _one_line(f"ended {summary.end_reason.value}" + (f": {why}" if why else ""))
    return CheckOutcome(task.name, check, summary.reward, passed, duration, detail)


async def _apply_oracle(sandbox: Sandbox, task: Task) -> str:
    """Run solve.sh; return what to show if the reward then comes out wrong."""
    result = await apply_oracle(sandbox, task)
    if result.timed_out or result.exit_code != 0:
        state = "timed out" if result.timed_out else f"exited {result.exit_code}"
        return f"solve.sh {state}: {_one_line(result.output[-300:])}"
    return ""


class _ProgressPrinter:
    """One line per finished check, numbered, so a long run shows where it is."""

    def __init__(self, total: int, out: TextIO) -> None:
        self.total, self.done, self.out = total, 0, out

    def __call__(self, outcome: CheckOutcome) -> None:
        self.done += 1
        verdict = "ok  " if outcome.passed else "FAIL"
        reward = "-" if outcome.reward is None else f"{outcome.reward:g}"
        width = len(str(self.total))
        line = f"[{self.done:>{width}}/{self.total}] {verdict} {outcome.check:<6} {outcome.task}  reward={reward}"
        self.out.write(f"{line}  ({outcome.duration_s:.1f}s){'  ' + outcome.detail if not outcome.passed else ''}\n")
        self.out.flush()


def print_outcomes(
    outcomes: list[CheckOutcome], elapsed_s: float, out: TextIO, audit: AuditReport | None = None
) -> None:
    """The end-of-run table: one row per task, the checks side by side, and what an audit report found."""
    from terminus_env.audit.report import audit_cell

    by_task: dict[str, dict[str, CheckOutcome]] = {}
    for outcome in outcomes:
        by_task.setdefault(outcome.task, {})[outcome.check] = outcome
    rows = []
    for name, checks in by_task.items():
        cells = [_cell(checks.get(c), checks) for c in CHECKS]
        problem = next((o.detail for o in checks.values() if not o.passed), "")
        audited = (audit_cell(audit, name),) if audit is not None else ()
        rows.append((name, *cells, *audited,
                     "ok" if all(o.passed for o in checks.values()) else f"FAIL {problem}"[:120]))  # fmt: skip
    out.write("\n")
    header = ("task", "nop (want 0)", "oracle (want 1)", "train nop (want 0)", "train oracle (want 1)",
              *(("audit",) if audit is not None else ()), "result")  # fmt: skip
    _print_table(header, rows, out)
    failed = sum(1 for row in rows if row[-1] != "ok")
    out.write(f"\n{len(rows) - failed}/{len(rows)} tasks valid in {elapsed_s:.0f}s\n")


def _cell(outcome: CheckOutcome | None, checks: dict[str, CheckOutcome]) -> str:
    if outcome is None:
        early = next(iter(checks.values()))
        return f"{early.check} failed"
    return "error" if outcome.reward is None else f"{outcome.reward:g}"


def _print_table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]], out: TextIO) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, tuple("-" * w for w in widths), *rows]:
        out.write("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip() + "\n")
    out.flush()


def _one_line(value: object) -> str:
    return " ".join(str(value).split())


def _output_tail(output: str, chars: int = 300) -> str:
    """The end of the verifier's output when it names no failing test, starting at a whole word."""
    text = _one_line(output)
    if len(text) <= chars:
        return text
    tail = text[-chars:]
    return "…" + tail[tail.find(" ") + 1 :] if " " in tail else "…" + tail
