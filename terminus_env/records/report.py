"""The final report of an eval run: per task, per category and overall, the first failure of each unsolved task, the
score with its confidence interval, and the format-error figures. Computed from the run file alone, so a resumed run
ends on the table an uninterrupted one prints."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TextIO

from terminus_env.records import stats
from terminus_env.records.metrics import aggregate
from terminus_env.records.run_log import RunContents, TaskStage

STAGE_FAILED = {TaskStage.LOAD: "could not load", TaskStage.IMAGE: "could not build its image"}


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
                     with_ci(score)))  # fmt: skip
    _table(rows, out)

    failures = _first_failures(contents)
    if failures:
        out.write("\nfirst failure of each unsolved task:\n")
        for name in [t.task for t in report.tasks if t.task in failures]:
            out.write(f"  {name}: {failures[name]}\n")

    overall = report.overall
    out.write(f"\nscore {with_ci(overall)} over {overall.tasks} tasks: the mean over tasks of each task's mean "
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
    summarized = [r.summary["summarizations"] for r in contents.rollouts
                  if r.summary is not None and r.summary.get("summarizations")]  # fmt: skip
    if summarized:
        out.write(f"context summarized in {len(summarized)} rollouts ({sum(summarized)} times): their conversations "
                  "were replaced to carry on past a full context\n")  # fmt: skip
    hackable = contents.config.hackable
    if hackable and contents.config.hackable_policy == "mark":
        out.write(f"hackable (the audit report {contents.config.audit_report} passed their verifiers without solving "
                  "them; the scores above count them):\n")  # fmt: skip
        out.writelines(f"  {task}: {why}\n" for task, why in hackable.items())
    elif hackable:
        out.write(f"left out as hackable (the audit report {contents.config.audit_report}): "
                  f"{', '.join(hackable)}\n")  # fmt: skip
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
        found.setdefault(e.task, f"{STAGE_FAILED[e.stage]}: {_clip(e.error.splitlines()[0])}")
    return found


def _clip(text: str, cap: int = 300) -> str:
    """One line of at most ``cap`` characters, cut between words."""
    text = " ".join(text.split())
    return text if len(text) <= cap else text[: text.rfind(" ", 0, cap)] + " …"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def with_ci(score: stats.Score) -> str:
    """The score as the report prints it: ``mean ± half-width (low–high)``, or ``± n/a`` without an interval."""
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
