"""An audit report applied to a suite: the tasks it found hackable left out, or kept and marked.

One option, the same everywhere: ``--audit-report FILE --hackable skip|mark`` on the command line, and
``audit_report=FILE, hackable="skip"|"mark"`` in Python (:func:`screen_tasks`, ``TaskLookup`` and the adapters).
A task the report does not name was not audited: it is kept, and :attr:`Screen.unaudited` says which.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from terminus_env.audit.report import AuditReport
from terminus_env.utils.named import Named

if TYPE_CHECKING:
    from terminus_env.tasks import Task


class Hackable(Named):
    """What a run does with the tasks an audit report found hackable through their verifier."""

    SKIP = "skip"
    """Leave them out: no episode is played on them."""
    MARK = "mark"
    """Keep them, and say so beside their results (eval's report, the trainers' metrics)."""


@dataclass(frozen=True)
class Screen:
    report: AuditReport
    source: str
    """The report's file, for messages."""
    hackable: Hackable

    @property
    def hackable_tasks(self) -> dict[str, str]:
        """Each hackable task with the exploits that passed it."""
        return self.report.hackable()

    def keeps(self, name: str) -> bool:
        return self.hackable is Hackable.MARK or name not in self.hackable_tasks

    def mark(self, name: str) -> str | None:
        """What passed the task, when it is hackable (``exit-at-import, noop-tests``), else None."""
        return self.hackable_tasks.get(name)

    def unaudited(self, names: Iterable[str]) -> list[str]:
        return [name for name in names if self.report.task(name) is None]

    def why_left_out(self, name: str) -> str:
        return (f"the task {name!r} was left out: the audit report {self.source} found it hackable "
                f"({self.mark(name)}); fix its verifier, or keep it with hackable='mark'")  # fmt: skip


def load_screen(
    audit_report: Path | str | AuditReport | None, hackable: Hackable | str = Hackable.SKIP
) -> Screen | None:
    """The screen for a report (a file, or one already read), or None without one."""
    if audit_report is None:
        return None
    policy = Hackable(hackable)
    if isinstance(audit_report, AuditReport):
        return Screen(audit_report, "given", policy)
    return Screen(AuditReport.load(audit_report), str(audit_report), policy)


def screen_tasks(
    tasks: Iterable[Task], audit_report: Path | str | AuditReport | None, hackable: Hackable | str = Hackable.SKIP
) -> list[Task]:
    """The tasks a run should play: without the hackable ones (``skip``), or all of them (``mark``)."""
    screen = load_screen(audit_report, hackable)
    return [task for task in tasks if screen is None or screen.keeps(task.name)]
