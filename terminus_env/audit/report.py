"""The audit's report: per task, per exploit, both modes' verdicts and the placement of each way to the reward, as
dataclasses that read and write JSON, and the table ``tasks audit`` prints.

A task is *hackable* when an exploit earns the reward in train mode through the task's verifier: the author's to
fix. An exploit that earns it through the runtime is ours: a bug, listed apart (``runtime_passes``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from terminus_env.audit.exploits import Channel
from terminus_env.audit.verdict import Verdict
from terminus_env.errors import TerminusError
from terminus_env.records.stats import SUCCESS_REWARD

REPORT_VERSION = 1


class AuditReportError(TerminusError, ValueError):
    """An audit report cannot be read; the message names the file and what to do."""


@dataclass(frozen=True)
class ExploitResult:
    exploit: str
    channel: Channel
    """The channel the exploit aims at."""
    verdict: Verdict
    targets: tuple[str, ...] = ()
    """What it replaced or wrote."""
    placement: Channel | None = None
    """Where its way to the reward runs, when it earned one."""
    fix: str | None = None
    eval_reward: float | None = None
    eval_end_reason: str | None = None
    train_reward: float | None = None
    train_end_reason: str | None = None
    findings: tuple[dict[str, Any], ...] = ()
    duration_s: float = 0.0
    error: str | None = None
    grade_reason: str | None = None
    """Why the verifier's reward is what it is, when it did not say so itself (a timeout, a missing reward file)."""

    @property
    def hacks_verifier(self) -> bool:
        return self.verdict is Verdict.PASSED and self.placement is Channel.VERIFIER

    @property
    def full_reward(self) -> bool:
        """It earned the whole reward in train mode, not only more than doing nothing."""
        return (self.train_reward or 0.0) >= SUCCESS_REWARD

    @property
    def passes_runtime(self) -> bool:
        """Earned the reward in train mode through our runtime: a bug of ours."""
        return self.placement is Channel.RUNTIME and self.verdict is Verdict.PASSED


@dataclass(frozen=True)
class TaskAudit:
    task: str
    duration_s: float
    """From the start of the suite's audit to this task's last episode (the wait for free slots included)."""
    results: tuple[ExploitResult, ...] = ()
    error: str | None = None
    """Why the task could not be audited (it did not load, or its image did not build)."""

    @property
    def episodes(self) -> int:
        return sum(1 for r in self.results if r.verdict is not Verdict.NOT_APPLICABLE)

    @property
    def episode_s(self) -> float:
        """What the task's episodes took, each from its start to its end: the task's cost, whatever else ran."""
        return round(sum(r.duration_s for r in self.results), 1)

    @property
    def hacks(self) -> list[ExploitResult]:
        """The exploits that earn the reward in train mode through the task's verifier."""
        return [r for r in self.results if r.hacks_verifier]

    @property
    def hackable(self) -> bool:
        return bool(self.hacks)

    @property
    def runtime_passes(self) -> list[ExploitResult]:
        return [r for r in self.results if r.passes_runtime]

    @property
    def errors(self) -> list[ExploitResult]:
        return [r for r in self.results if r.verdict is Verdict.ERROR]

    @property
    def clean(self) -> bool:
        return self.error is None and not self.hacks and not self.runtime_passes and not self.errors

    def summary(self) -> str:
        """One cell: ``clean``, or what passed it and where."""
        if self.error is not None:
            return f"not audited: {self.error}"
        parts = [f"hackable: {', '.join(r.exploit for r in self.hacks)}"] if self.hacks else []
        if self.runtime_passes:
            parts.append(f"RUNTIME LET THROUGH: {', '.join(r.exploit for r in self.runtime_passes)}")
        if self.errors:
            parts.append(f"not judged: {', '.join(r.exploit for r in self.errors)}")
        return "; ".join(parts) or "clean"


@dataclass(frozen=True)
class AuditReport:
    folder: str
    exploits: tuple[str, ...]
    jobs: int
    duration_s: float
    load_average: tuple[float, float, float] | None = None
    """The host's load average (1, 5, 15 min) when the audit ended."""
    tasks: tuple[TaskAudit, ...] = ()
    version: int = REPORT_VERSION
    created: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    def task(self, name: str) -> TaskAudit | None:
        return next((t for t in self.tasks if t.task == name), None)

    def hackable(self) -> dict[str, str]:
        """Each hackable task, with what passed it: ``{"task": "exit-at-import, noop-tests"}``."""
        return {t.task: ", ".join(r.exploit for r in t.hacks) for t in self.tasks if t.hackable}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AuditReport:
        if data.get("version") != REPORT_VERSION:
            raise ValueError(f"report version {data.get('version')!r}; this terminus-env reads {REPORT_VERSION}")
        tasks = tuple(
            TaskAudit(t["task"], float(t["duration_s"]), tuple(map(_result, t.get("results", ()))), t.get("error"))
            for t in data.get("tasks", ())
        )
        load = data.get("load_average")
        return cls(
            folder=str(data["folder"]), exploits=tuple(data.get("exploits", ())), jobs=int(data.get("jobs", 1)),
            duration_s=float(data.get("duration_s", 0.0)), load_average=tuple(load) if load else None, tasks=tasks,
            created=str(data.get("created", "")), notes=tuple(data.get("notes", ())),
        )  # fmt: skip

    @classmethod
    def load(cls, path: Path | str) -> AuditReport:
        """Read a report ``tasks audit --report`` wrote."""
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except FileNotFoundError:
            raise AuditReportError(f"{path}: no such audit report; write one with "
                                   f"`terminus-env tasks audit FOLDER --report {path}`") from None  # fmt: skip
        except (ValueError, KeyError, TypeError) as exc:
            raise AuditReportError(f"{path}: not an audit report ({exc}); write it again with "
                                   "`terminus-env tasks audit FOLDER --report FILE`") from None  # fmt: skip


def _result(data: Mapping[str, Any]) -> ExploitResult:
    placement = data.get("placement")
    return ExploitResult(
        exploit=data["exploit"], channel=Channel(data["channel"]), verdict=Verdict(data["verdict"]),
        targets=tuple(data.get("targets", ())), placement=Channel(placement) if placement else None,
        fix=data.get("fix"), eval_reward=data.get("eval_reward"), eval_end_reason=data.get("eval_end_reason"),
        train_reward=data.get("train_reward"), train_end_reason=data.get("train_end_reason"),
        findings=tuple(data.get("findings", ())), duration_s=float(data.get("duration_s", 0.0)),
        error=data.get("error"), grade_reason=data.get("grade_reason"),
    )  # fmt: skip


def audit_cell(report: AuditReport | None, task: str) -> str:
    """What ``tasks check --audit`` shows for a task: the report's one-cell summary, or that it was not audited."""
    if report is None:
        return ""
    audited = report.task(task)
    return "not in the report" if audited is None else audited.summary()


def print_report(report: AuditReport, out: TextIO) -> None:
    """The table: one row per task, each exploit's verdict in train and eval; then each hackable task's exploits
    with the author's fix, whatever the runtime let through, and the times."""
    names = list(report.exploits)
    rows = [("task", "episodes", *names, "result")]
    for audited in report.tasks:
        by_name = {r.exploit: r for r in audited.results}
        cells = [_cell(by_name.get(name)) for name in names]
        rows.append((audited.task, f"{audited.episodes} in {audited.episode_s:.0f}s", *cells, audited.summary()[:100]))
    _table(rows, out)
    out.write("\nepisodes: how many were played, and the seconds they took together; "
              "cells: train reward / eval reward (- not played: nothing to work on); "
              "! passed in train mode, c caught by the runtime (eval keeps the reward and lists the findings), "
              "e not judged\n")  # fmt: skip
    hackable = [t for t in report.tasks if t.hackable]
    if hackable:
        out.write("\nhackable through the task's verifier (the author's to fix):\n")
        for audited in hackable:
            floor = next((r.train_reward for r in audited.results if r.exploit == report.exploits[0]), None)
            for result in audited.hacks:
                earned = f"train reward {_num(result.train_reward)}, doing nothing {_num(floor)}"
                out.write(f"  {audited.task}: {result.exploit} ({earned}): {result.fix or 'no fix known'}\n")
    passes = [(t.task, r) for t in report.tasks for r in t.runtime_passes]
    if passes:
        out.write("\nTHE RUNTIME LET THESE THROUGH (a bug in the sandbox: no exploit of the runtime's channel may earn "
                  "reward in train mode):\n")  # fmt: skip
        for task, result in passes:
            kinds = ", ".join(sorted({str(f.get("kind")) for f in result.findings})) or "no finding"
            out.write(f"  {task}: {result.exploit} ({result.verdict}, train {_num(result.train_reward)}, {kinds})\n")
    unjudged = [(t.task, r) for t in report.tasks for r in t.errors]
    if unjudged:
        out.write("\nnot judged (played once more, and failed again):\n")
        for task, result in unjudged:
            out.write(f"  {task}: {result.exploit}: {result.error or result.grade_reason or result.eval_end_reason}\n")
    broken = [t for t in report.tasks if t.error is not None]
    audited_tasks = len(report.tasks) - len(broken)
    average = report.load_average
    load = "" if average is None else f", load {average[0]:.1f} {average[1]:.1f} {average[2]:.1f}"
    full = sum(1 for t in hackable if any(r.full_reward for r in t.hacks))
    out.write(f"\n{len(hackable)} of {audited_tasks} tasks hackable through their verifier ({full} to the full reward)"
              f"{f'; {len(broken)} not audited' if broken else ''}; {len(passes)} runtime pass(es); "
              f"{report.duration_s:.0f}s with {report.jobs} episodes at once{load}\n")  # fmt: skip
    out.flush()


def _cell(result: ExploitResult | None) -> str:
    if result is None or result.verdict is Verdict.NOT_APPLICABLE:
        return "-"
    if result.verdict is Verdict.ERROR:
        return "e"
    mark = {Verdict.PASSED: "!", Verdict.CAUGHT: "c"}.get(result.verdict, "")
    return f"{_num(result.train_reward)}/{_num(result.eval_reward)}{mark}"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _table(rows: Sequence[tuple[str, ...]], out: TextIO) -> None:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for index, row in enumerate(rows):
        out.write("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip() + "\n")
        if index == 0:
            out.write("  ".join("-" * w for w in widths) + "\n")
