"""Find a trial to look at in what ``terminus-env view RUN`` is given: a Harbor job folder, one of its trial
folders, or an eval run file (:mod:`terminus_env.viewer.job_source` reads all of a job's trials).

Every source comes out the same way: the trial's ATIF trajectory and its Harbor ``result.json``. A run file's
rollouts are converted as the eval's job writer converts them, so a page looks the same whichever was given;
a trial folder written by Harbor itself (its Terminus 2 agent writes ATIF too) can be looked at as well.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from terminus_env.errors import TerminusError
from terminus_env.records.atif import agent_spec, atif_trajectory
from terminus_env.records.harbor_job import CONFIG, RESULT, TRAJECTORY, VERIFIER, VERIFIER_FILES
from terminus_env.records.harbor_records import JobInfo, rollout_result, trial_name
from terminus_env.records.run_log import RolloutRecord, RunContents, RunFileError, read_run


class ViewError(TerminusError):
    """RUN holds nothing to look at, or not the trial asked for; the message says what to pass instead."""


@dataclass(frozen=True)
class Trial:
    """One trial, as the page shows it."""

    name: str
    trajectory: dict[str, Any] | None
    """The ATIF document; None when the trial never reached its first observation."""
    result: dict[str, Any] | None
    """Harbor's ``result.json`` of the trial."""
    verifier: dict[str, str] = field(default_factory=dict)
    """The verifier's files by their names in the trial's ``verifier/`` folder (its output: ``test-stdout.txt``)."""
    end_reason: str | None = None
    """How the trial ended, where its result does not say: a run file names the stage at which a broken task failed
    (``load_error``, ``image_error``)."""


@dataclass(frozen=True)
class Found:
    trial: Trial
    names: tuple[str, ...]
    """Every trial RUN holds, so the user can pick another with ``--trial``."""


def find_trial(run: Path, wanted: str | None = None) -> Found:
    """The trial named ``wanted`` in ``run`` (the first one, by name, when None)."""
    run = Path(run)
    if run.is_file():
        return _from_run_file(run, wanted)
    if is_trial_folder(run):
        if wanted is not None and wanted != run.name:
            raise ViewError(f"{run} is the trial folder of {run.name}; pass its job folder to choose another trial")
        return Found(read_trial_folder(run), (run.name,))
    names = trial_folders(run)
    if names:
        return Found(read_trial_folder(run / _choose(run, names, wanted)), names)
    raise not_a_run(run)


def not_a_run(run: Path) -> ViewError:
    return ViewError(f"{run}: not an eval run file (.jsonl), a training run's step log (.jsonl), a Harbor job folder "
                     "or a trial folder; pass one of those (an eval prints where it wrote each)")  # fmt: skip


def trial_folders(run: Path) -> tuple[str, ...]:
    """The names of the trial folders in ``run``, sorted; none when it is no job folder."""
    if not run.is_dir():
        return ()
    return tuple(sorted(child.name for child in run.iterdir() if child.is_dir() and is_trial_folder(child)))


def read_run_file(run: Path) -> RunContents:
    try:
        return read_run(run)
    except RunFileError as exc:
        raise ViewError(str(exc)) from exc


def run_file_job(run: Path, contents: RunContents) -> JobInfo:
    """The job a run file's rollouts are shown as: the one the eval wrote beside it, by default."""
    return JobInfo(
        job_id=str(uuid.uuid5(uuid.NAMESPACE_URL, run.resolve().as_uri())),
        job_dir=run.parent / run.stem,
        agent=agent_spec(contents.config),
        task_paths={task: Path(contents.config.folder) / task for task in _tasks(contents)},
    )


def run_file_trial(job: JobInfo, record: RolloutRecord) -> Trial:
    """One rollout of a run file, converted as the eval's job writer converts it."""
    verifier = {k: v for k, v in ((record.trajectory or {}).get("verifier") or {}).items() if k in VERIFIER_FILES}
    name = trial_name(record.task, record.trial)
    result = rollout_result(job, record, checksum="")
    return Trial(name, atif_trajectory(record, job.agent), result, verifier, record.end_reason)


def _tasks(contents: RunContents) -> list[str]:
    return [*dict.fromkeys([*(r.task for r in contents.rollouts), *(e.task for e in contents.task_errors)])]


def _from_run_file(run: Path, wanted: str | None) -> Found:
    contents = read_run_file(run)
    records = {trial_name(r.task, r.trial): r for r in contents.rollouts}
    if not records:
        raise ViewError(f"{run} holds no finished rollout yet; look again once one has ended")
    name = _choose(run, tuple(sorted(records)), wanted)
    return Found(run_file_trial(run_file_job(run, contents), records[name]), tuple(sorted(records)))


def _choose(run: Path, names: tuple[str, ...], wanted: str | None) -> str:
    if wanted is None:
        return names[0]
    if wanted not in names:
        raise ViewError(f"{run} has no trial {wanted!r}; it has: {', '.join(names)}")
    return wanted


def is_trial_folder(path: Path) -> bool:
    return path.is_dir() and ((path / TRAJECTORY).is_file() or _trial_config(path))


def _trial_config(path: Path) -> bool:
    """A trial's ``config.json`` names the trial (a job's does not)."""
    document = read_json(path / CONFIG)
    return document is not None and "trial_name" in document


def read_trial_folder(path: Path) -> Trial:
    verifier = {}
    for name in VERIFIER_FILES:
        try:
            verifier[name] = (path / VERIFIER / name).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
    return Trial(path.name, read_json(path / TRAJECTORY), read_json(path / RESULT), verifier)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ViewError(f"{path}: not readable JSON ({exc}); was it cut short? Rewrite the job with the eval's "
                        "--resume, or look at the run file instead") from exc  # fmt: skip
    return document if isinstance(document, dict) else None
