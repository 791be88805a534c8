"""What a job's page shows, as data: the score with its interval and pass@k, each task's trials, how the trials ended,
the format errors, the trials flagged for tampering and the masked ones.

Pure: a :class:`Job`'s results in, a :class:`JobSummary` out. The statistics are the eval's own
(:func:`terminus_env.records.stats.report`, :func:`terminus_env.records.metrics.aggregate`) over the same trials, so
the page shows the numbers ``terminus-env eval`` prints; :meth:`JobSummary.as_dict` is the JSON written beside the page.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from terminus_env.records import stats
from terminus_env.records.metrics import BatchMetrics, aggregate
from terminus_env.records.timeline import epoch
from terminus_env.viewer.job_source import Job, TrialResult, task_of

NO_RESULT = "no result.json yet: the trial is still running, or was cut short"


@dataclass(frozen=True)
class TrialRow:
    name: str
    task: str
    reward: float | None
    """None when no reward counts: the infrastructure failed, or the trial never ran."""
    end_reason: str
    masked: str | None
    """Why the score leaves the trial out (a trainer would drop it too); None when it counts."""
    turns: int | None
    format_errors: int | None
    tokens_in: int | None
    tokens_out: int | None
    wall_s: float | None
    detail: str | None
    """Why it earned less than 1: the first failing test, the grader's reason, or the error."""
    tampering: tuple[dict[str, Any], ...]
    """What the verifier ran that the agent changed: ``{"kind", "path", "detail"}`` each."""
    page: str
    """The trial's own page, relative to the job's page."""

    @property
    def solved(self) -> bool:
        return self.reward is not None and self.reward >= stats.SUCCESS_REWARD


@dataclass(frozen=True)
class TaskRow:
    task: str
    score: stats.TaskScore
    trials: tuple[TrialRow, ...]
    format_errors: int
    mean_turns: float | None
    mean_tokens_in: float | None
    mean_tokens_out: float | None
    mean_wall_s: float | None


@dataclass(frozen=True)
class JobSummary:
    name: str
    source: str
    """The job folder or run file, as given."""
    kind: str
    agent: str | None
    model: str | None
    report: stats.Report
    metrics: BatchMetrics
    """The format-error, tamper and end-reason figures over the rollouts that have an episode summary."""
    tasks: tuple[TaskRow, ...]
    format_error_counts: dict[int, int]
    """How many rollouts had 0, 1, 2, ... format errors."""

    @property
    def trials(self) -> tuple[TrialRow, ...]:
        return tuple(trial for task in self.tasks for trial in task.trials)

    @property
    def tampered(self) -> tuple[TrialRow, ...]:
        return tuple(trial for trial in self.trials if trial.tampering)

    @property
    def masked(self) -> tuple[TrialRow, ...]:
        return tuple(trial for trial in self.trials if trial.masked is not None)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: everything the page shows, with the names of the tampered and masked trials."""
        document = asdict(self)
        document["tampered"] = [trial.name for trial in self.tampered]
        document["masked"] = [trial.name for trial in self.masked]
        return document


def summarize_job(job: Job, pages: Mapping[str, str]) -> JobSummary:
    """The summary of ``job``; ``pages`` gives each trial's page by trial name, relative to the job's page."""
    rows = [_row(result, pages.get(result.name, "")) for result in job.results]
    categories = {result.name: result.category for result in job.results}
    trials = [stats.Trial(row.task, row.reward or 0.0, row.end_reason, valid=row.masked is None,
                          category=categories[row.name]) for row in rows]  # fmt: skip
    report = stats.report(trials, job.k, job.task_order)
    summaries = [s for s in (_metadata(result.result) for result in job.results) if "format_errors" in s]
    by_task: dict[str, list[TrialRow]] = {}
    for row in rows:
        by_task.setdefault(row.task, []).append(row)
    tasks = tuple(_task_row(score, by_task[score.task]) for score in report.tasks)
    agent = next((r.result.get("agent_info") for r in job.results if r.result.get("agent_info")), None) or {}
    return JobSummary(
        name=job.name,
        source=str(job.path),
        kind=job.kind.value,
        agent=" ".join(str(agent[key]) for key in ("name", "version") if agent.get(key)) or None,
        model=(agent.get("model_info") or {}).get("name"),
        report=report,
        metrics=aggregate(summaries),
        tasks=tasks,
        format_error_counts=dict(sorted(Counter(int(s["format_errors"]) for s in summaries).items())),
    )


def _row(trial: TrialResult, page: str) -> TrialRow:
    result = trial.result
    metadata = _metadata(result)
    agent = result.get("agent_result") or {}
    exception = result.get("exception_info")
    error = f"{exception.get('exception_type')}: {exception.get('exception_message')}" if exception else None
    rewards = (result.get("verifier_result") or {}).get("rewards") or {}
    valid = bool(result.get("reward_valid", bool(rewards) and exception is None)) and bool(rewards)
    reward = rewards.get("reward", next(iter(rewards.values()), None)) if valid else None
    end_reason = trial.end_reason or metadata.get("end_reason") or (exception or {}).get("exception_type") or "unknown"
    detail = metadata.get("detail") or metadata.get("failure") or metadata.get("error") or error
    masked = None
    if not valid:
        masked = error or metadata.get("error") or metadata.get("grade_reason") or metadata.get("detail")
        masked = masked or (NO_RESULT if "id" not in result else "no reward was recorded")
    return TrialRow(
        name=trial.name,
        task=str(result.get("task_name") or task_of(trial.name)),
        reward=None if reward is None else float(reward),
        end_reason=str(end_reason),
        masked=masked,
        turns=_int(metadata.get("turns")),
        format_errors=_int(metadata.get("format_errors")),
        tokens_in=_int(agent.get("n_input_tokens")),
        tokens_out=_int(agent.get("n_output_tokens")),
        wall_s=_wall(result),
        detail=None if detail is None else str(detail),
        tampering=tuple(dict(finding) for finding in metadata.get("tampering") or () if isinstance(finding, Mapping)),
        page=page,
    )


def _task_row(score: stats.TaskScore, trials: list[TrialRow]) -> TaskRow:
    return TaskRow(
        task=score.task,
        score=score,
        trials=tuple(trials),
        format_errors=sum(t.format_errors or 0 for t in trials),
        mean_turns=_mean(t.turns for t in trials),
        mean_tokens_in=_mean(t.tokens_in for t in trials),
        mean_tokens_out=_mean(t.tokens_out for t in trials),
        mean_wall_s=_mean(t.wall_s for t in trials),
    )


def _metadata(result: Mapping[str, Any]) -> Mapping[str, Any]:
    """The episode summary this package keeps in ``agent_result.metadata`` (Harbor's own trials keep none)."""
    metadata = (result.get("agent_result") or {}).get("metadata")
    return metadata if isinstance(metadata, Mapping) else {}


def _wall(result: Mapping[str, Any]) -> float | None:
    started, finished = result.get("started_at"), result.get("finished_at")
    if not started or not finished:
        return None
    return round(epoch(finished) - epoch(started), 3)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None
