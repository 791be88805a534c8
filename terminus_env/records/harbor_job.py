"""An eval run written in Harbor's job layout, beside the run file, so Harbor's tools read it.

```
JOBS_DIR/<job>/config.json, result.json
JOBS_DIR/<job>/<task>__<trial>/config.json, result.json, trial.log
JOBS_DIR/<job>/<task>__<trial>/agent/trajectory.json, recording.cast, trajectory.summarization-N-<request>.json
JOBS_DIR/<job>/<task>__<trial>/verifier/test-stdout.txt, reward.txt, reward.json, ctrf.json (those written)
```

The run file stays the source of truth: each trial folder is written as its rollout ends, and at the end of
the run (or of a resumed run) the trials still missing are written from the run file, so a kill between the
two writes loses nothing. Every file is written whole (a temporary file, then a rename), ``result.json`` last,
so a trial folder with a ``result.json`` is complete. A folder that cannot be written is reported and the run
goes on: the job is a view of the run file, and can be rewritten from it with ``--resume``.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from terminus_env.errors import TerminusError
from terminus_env.records import stats
from terminus_env.records.atif import AgentSpec, atif_trajectory, subagent_trajectories
from terminus_env.records.cast import asciinema_cast
from terminus_env.records.harbor_records import (
    JobInfo,
    job_config,
    job_result,
    rollout_result,
    task_error_result,
    trial_config,
    trial_log,
    trial_name,
)
from terminus_env.records.run_log import RolloutRecord, RunContents
from terminus_env.records.timeline import epoch
from terminus_env.sandbox.images import context_hash

TRAJECTORY = Path("agent") / "trajectory.json"
RECORDING = Path("agent") / "recording.cast"
VERIFIER = Path("verifier")
CONFIG, RESULT, TRIAL_LOG = "config.json", "result.json", "trial.log"
VERIFIER_FILES = ("test-stdout.txt", "reward.txt", "reward.json", "ctrf.json")
"""What a trial's ``verifier/`` folder may hold, as Harbor names the files."""


class JobFolderError(TerminusError):
    """The job folder cannot be used as asked; the message says what to do instead."""


class HarborJob:
    """One job folder, kept in step with one eval run."""

    def __init__(self, info: JobInfo, *, trials: int, started_at: float) -> None:
        self.info = info
        self._trials = trials
        self._started_at = started_at
        self._checksums: dict[str, str] = {}

    @property
    def path(self) -> Path:
        return self.info.job_dir

    @classmethod
    def open(
        cls, job_dir: Path, agent: AgentSpec, task_paths: Mapping[str, Path], *, trials: int, concurrency: int,
        resume: bool,
    ) -> HarborJob:  # fmt: skip
        """Create the folder of a new run (refusing one that exists), or reopen a resumed run's."""
        job_dir = Path(job_dir).resolve()  # Harbor's configs hold absolute paths
        if job_dir.exists() and not resume:
            raise JobFolderError(f"{job_dir} exists: remove it, pass another --jobs-dir, or choose another --run-file "
                                 "(the job is named after the run file)")  # fmt: skip
        previous = _identity(job_dir / RESULT) if resume else None
        job_id, started_at = previous or (str(uuid.uuid4()), time.time())
        job = cls(JobInfo(job_id, job_dir, agent, dict(task_paths)), trials=trials, started_at=started_at)
        try:
            job_dir.mkdir(parents=True, exist_ok=True)
            _write_json(job_dir / CONFIG, job_config(job.info, trials=trials, concurrency=concurrency))
            if previous is None:
                job._write_result([], None, finished=False)
        except OSError as exc:
            raise JobFolderError(f"cannot write the job folder {job_dir} ({exc}); pass a writable --jobs-dir") from exc
        return job

    def add_rollout(self, record: RolloutRecord) -> None:
        """Write one finished rollout's trial folder; raises OSError when it cannot."""
        self._write_rollout(record)

    def finish(self, contents: RunContents, report: stats.Report | None, *, finished: bool) -> list[str]:
        """Write the trials the folder lacks (rollouts whose folder was not written, and a folder for each trial a
        broken task could not run) and the job's ``result.json``; returns what could not be written."""
        problems: list[str] = []
        results: list[dict[str, Any]] = []
        for record in contents.rollouts:
            name = trial_name(record.task, record.trial)
            written = _read_json(self.path / name / RESULT)
            try:
                ran = written is not None and written.get("agent_result") is not None  # not a broken task's, before
                results.append(written if written is not None and ran else self._write_rollout(record))
            except OSError as exc:
                problems.append(f"{name}: {exc}")
        at = time.time()
        for error in contents.current_task_errors():  # tasks without a rollout: none of their trials ran
            for trial in range(contents.config.trials):
                name = trial_name(error.task, trial)
                result = task_error_result(self.info, error, trial, self._checksum(error.task), at)
                results.append(result)
                try:
                    self._write_trial(name, error.task, result)
                except OSError as exc:
                    problems.append(f"{name}: {exc}")
        try:
            self._write_result(results, report, finished=finished)
        except OSError as exc:
            problems.append(f"{RESULT}: {exc}")
        return problems

    def _write_rollout(self, record: RolloutRecord) -> dict[str, Any]:
        name = trial_name(record.task, record.trial)
        folder = self.path / name
        trajectory = atif_trajectory(record, self.info.agent)
        if trajectory is not None:
            for file_name, document in subagent_trajectories(record, self.info.agent).items():
                _write_text(folder / TRAJECTORY.parent / file_name, _compact_json(document))
            _write_text(folder / TRAJECTORY, _compact_json(trajectory))
        cast = asciinema_cast(record.trajectory or {}, f"{record.task} #{record.trial}")
        if cast is not None:
            _write_text(folder / RECORDING, cast)
        verifier = (record.trajectory or {}).get("verifier") or {}
        for file_name in VERIFIER_FILES:  # only Harbor's names: the run file is not trusted to name paths
            if isinstance(verifier.get(file_name), str):
                _write_text(folder / VERIFIER / file_name, verifier[file_name])
        _write_text(folder / TRIAL_LOG, trial_log(record))
        result = rollout_result(self.info, record, self._checksum(record.task))
        self._write_trial(name, record.task, result)
        return result

    def _write_trial(self, name: str, task: str, result: dict[str, Any]) -> None:
        _write_json(self.path / name / CONFIG, trial_config(self.info, task, name))
        _write_json(self.path / name / RESULT, result)

    def _write_result(
        self, results: Sequence[Mapping[str, Any]], report: stats.Report | None, *, finished: bool
    ) -> None:
        total = len(self.info.task_paths) * self._trials
        document = job_result(self.info, results, n_total=total, report=report, started_at=self._started_at,
                              finished_at=time.time() if finished else None)  # fmt: skip
        _write_json(self.path / RESULT, document)

    def _checksum(self, task: str) -> str:
        """A hash of every file of the task's folder (as task images are tagged), computed once per task."""
        if task not in self._checksums:
            path = self.info.task_paths.get(task)
            self._checksums[task] = context_hash(path) if path is not None and path.is_dir() else ""
        return self._checksums[task]


def _write_json(path: Path, document: Any) -> None:
    _write_text(path, json.dumps(document, indent=4, ensure_ascii=False))


def _compact_json(value: Any, indent: str = "") -> str:
    """Indented JSON with each list of numbers (token ids, logprobs) on one line, as Harbor writes trajectories:
    one number per line would make the file several times larger and no easier to read."""
    inner = indent + "  "
    if isinstance(value, dict) and value:
        entries = (f"{inner}{_compact_json(str(key))}: {_compact_json(item, inner)}" for key, item in value.items())
        return "{\n" + ",\n".join(entries) + f"\n{indent}}}"
    if isinstance(value, list) and value and not all(_is_number(item) for item in value):
        return "[\n" + ",\n".join(inner + _compact_json(item, inner) for item in value) + f"\n{indent}]"
    return json.dumps(value, ensure_ascii=False)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def _read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object written earlier, or None when it is missing or not one (it is then written again)."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) else None


def _identity(path: Path) -> tuple[str, float] | None:
    """The id and start of the job a resumed run continues, from its ``result.json``; None if unreadable."""
    previous = _read_json(path)
    try:
        return str(uuid.UUID(str(previous["id"]))), epoch(str(previous["started_at"]))  # type: ignore[index]
    except (TypeError, KeyError, ValueError):
        return None
