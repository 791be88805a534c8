"""Every trial of a job, for the job's page: a Harbor job folder or an eval run file, read alike.

The job's page needs every trial's ``result.json`` at once (reward, end reason, tokens, times, the episode summary)
and each trial's trajectory only while that trial's own page is written: trajectories with token ids and logprobs
can be large, so they are read one at a time (:meth:`Job.trial`). A run file's rollouts become the same
``result.json`` the eval's job writer makes of them, so both sources give the same page.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from terminus_env.records.harbor_job import CONFIG, RESULT
from terminus_env.records.harbor_records import rollout_result, task_error_result, trial_name
from terminus_env.utils.named import Named
from terminus_env.viewer.source import (
    Trial,
    ViewError,
    not_a_run,
    read_json,
    read_run_file,
    read_trial_folder,
    run_file_job,
    run_file_trial,
    trial_folders,
)


class SourceKind(Named):
    JOB_FOLDER = "job folder"
    RUN_FILE = "run file"


@dataclass(frozen=True)
class TrialResult:
    """One trial as the job's page counts it."""

    name: str
    result: dict[str, Any]
    """Harbor's ``result.json`` of the trial."""
    end_reason: str | None = None
    """How it ended, where the result does not say (see :attr:`Trial.end_reason`)."""
    category: str | None = None
    """The task's category, where it is recorded (not for the trials of a task that did not load)."""


@dataclass(frozen=True)
class Job:
    path: Path
    kind: SourceKind
    name: str
    k: int
    """Trials per task: the ``k`` of pass@k."""
    task_order: tuple[str, ...]
    results: tuple[TrialResult, ...]
    """Sorted by trial name."""
    _load: Callable[[str], Trial] = field(repr=False, compare=False)

    def trial(self, name: str) -> Trial:
        """The whole trial, with its trajectory and verifier files, for its own page."""
        return self._load(name)


def open_job(path: Path) -> Job:
    """The job in ``path``: an eval run file, or a job folder (a folder of trial folders)."""
    path = Path(path)
    if path.is_file():
        return _run_file(path)
    names = trial_folders(path)
    if not names:
        raise not_a_run(path)
    return _job_folder(path, names)


def _job_folder(path: Path, names: tuple[str, ...]) -> Job:
    results = []
    for name in names:
        try:
            result = read_json(path / name / RESULT)
        except ViewError as exc:  # one bad file loses its trial's figures, not the job's page
            error = {"exception_type": "UnreadableResult", "exception_message": str(exc)}
            result = {"trial_name": name, "task_name": task_of(name), "exception_info": error}
        if result is None:  # a trial still running, or one cut short: its page says what there is
            result = {"trial_name": name, "task_name": task_of(name)}
        metadata = (result.get("agent_result") or {}).get("metadata")
        category = metadata.get("category") if isinstance(metadata, dict) else None
        results.append(TrialResult(name, result, category=category if isinstance(category, str) else None))
    try:
        config = read_json(path / CONFIG) or {}
    except ViewError:  # the job's options: without them, the trials still say what they are
        config = {}
    order = tuple(Path(str(task.get("path", ""))).name for task in config.get("tasks") or [] if isinstance(task, dict))
    k = config.get("n_attempts")
    if not isinstance(k, int) or k < 1:  # the most trials any task has
        k = max(Counter(str(r.result.get("task_name") or task_of(r.name)) for r in results).values())
    return Job(path, SourceKind.JOB_FOLDER, path.name, k, order, tuple(results),
               lambda name: read_trial_folder(path / name))  # fmt: skip


def _run_file(path: Path) -> Job:
    contents = read_run_file(path)
    job = run_file_job(path, contents)
    records = {trial_name(r.task, r.trial): r for r in contents.rollouts}
    results = {name: TrialResult(name, rollout_result(job, r, checksum=""), r.end_reason, r.category)
               for name, r in records.items()}  # fmt: skip
    at = path.stat().st_mtime
    for error in contents.current_task_errors():  # each trial of a broken task, as the eval's report counts them
        for number in range(contents.config.trials):
            name = trial_name(error.task, number)
            result = task_error_result(job, error, number, "", at)
            results[name] = TrialResult(name, result, f"{error.stage.value}_error", error.category)
    if not results:
        raise ViewError(f"{path} holds no finished rollout yet; look again once one has ended")

    def load(name: str) -> Trial:
        record = records.get(name)
        if record is not None:
            return run_file_trial(job, record)
        return Trial(name, None, results[name].result, end_reason=results[name].end_reason)

    order = contents.config.names or tuple(job.task_paths)
    return Job(path, SourceKind.RUN_FILE, path.stem, contents.config.trials, tuple(order),
               tuple(results[name] for name in sorted(results)), load)  # fmt: skip


def task_of(name: str) -> str:
    """The task of a trial folder ``<task>__<id>``."""
    return name.rsplit("__", 1)[0]
