"""The eval run file: JSON lines, one record written and flushed to disk as each rollout ends.

The first line describes the run (its options), so ``--resume`` can refuse to mix two different
runs; every later line is a finished rollout or a task that could not load or build. A record is
one ``write`` of one whole line, so a run killed at any moment leaves at most a torn last line,
which resuming cuts off: the file is consistent after Ctrl-C, SIGTERM and SIGKILL alike.

A run file takes one writer: an open :class:`RunLog` holds an exclusive lock on it (``flock``, released by the
kernel when the process ends, however it ends), and a second eval on the same file is refused before it reads or
cuts anything.
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import Any, BinaryIO

from terminus_env.errors import TerminusError
from terminus_env.protocol.strictness import Strictness

FORMAT_VERSION = 1


class RunFileError(TerminusError, ValueError):
    """The run file cannot be used as asked; the message says what to do instead."""


class RecordKind(str, Enum):
    HEADER = "header"
    ROLLOUT = "rollout"
    TASK_ERROR = "task_error"


class TaskStage(str, Enum):
    """Where a task failed before any rollout could run."""

    LOAD = "load"
    IMAGE = "image"


@dataclass(frozen=True)
class RunConfig:
    """The options that decide what a run's rollouts are; a resumed run must use the same."""

    folder: str
    names: tuple[str, ...]
    trials: int
    policy: str
    strict_format: bool
    """Whether a rejected turn ended its episode, as the env resolved it (``--strict`` or SWE_EVAL_STRICT_FORMAT)."""
    strict_truncation: bool
    """Whether a turn that filled the token limit ended its episode (``--strict`` or SWE_EVAL_STRICT_TRUNCATION)."""
    max_turns: int | None
    max_turn_tokens: int
    sampling: dict[str, Any] = field(default_factory=dict)
    """The sampling parameters sent with every request (none: the server's defaults, as Harbor 0.26 sends none)."""
    summarize: bool = False
    """Context summarization (lenient evaluation); runs written before it existed did not summarize."""
    summarize_threshold: int = 8000
    context_window: int | None = None
    """The model's context in tokens, as the server reported it (or ``--context-window``); None when unknown."""
    hackable: dict[str, str] = field(default_factory=dict)
    """The tasks an audit report (``--audit-report``) found hackable, with what passed them: left out of the run
    (``hackable_policy`` ``skip``) or played and marked (``mark``)."""
    hackable_policy: str | None = None
    audit_report: str | None = None

    @property
    def strictness(self) -> Strictness:
        return Strictness(self.strict_format, self.strict_truncation)

    def differences(self, other: RunConfig) -> list[str]:
        """Human-readable ``name: ours vs theirs`` for every option that differs."""
        return [
            f"{f.name}: {getattr(other, f.name)!r} in the file, {getattr(self, f.name)!r} now"
            for f in fields(self)
            if getattr(self, f.name) != getattr(other, f.name)
        ]


@dataclass(frozen=True)
class RolloutRecord:
    task: str
    trial: int
    reward: float
    end_reason: str
    env_error: bool
    category: str | None = None
    detail: str | None = None
    """Why the rollout earned less than 1: the first failing test, the grader's reason, or the error."""
    wall_s: float = 0.0
    summary: dict[str, Any] | None = None
    trajectory: dict[str, Any] | None = None


@dataclass(frozen=True)
class TaskErrorRecord:
    task: str
    stage: TaskStage
    error: str
    category: str | None = None


@dataclass
class RunContents:
    config: RunConfig
    rollouts: list[RolloutRecord] = field(default_factory=list)
    task_errors: list[TaskErrorRecord] = field(default_factory=list)

    def finished(self) -> set[tuple[str, int]]:
        """(task, trial) of every rollout already in the file: a resumed run skips them."""
        return {(r.task, r.trial) for r in self.rollouts}

    def current_task_errors(self) -> list[TaskErrorRecord]:
        """The latest error of each task that has no rollout: a task fixed before a resume has rollouts."""
        ran = {r.task for r in self.rollouts}
        latest = {e.task: e for e in self.task_errors if e.task not in ran}
        return list(latest.values())


class RunLog:
    """An open run file, appended to record by record."""

    def __init__(self, path: Path, handle: BinaryIO) -> None:
        self.path = path
        self._handle = handle

    @classmethod
    def create(cls, path: Path, config: RunConfig) -> RunLog:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            handle = path.open("xb")
        except FileExistsError:
            raise RunFileError(
                f"{path} exists: pass --resume to continue that run, or choose another --run-file"
            ) from None
        log = cls(path, _locked(path, handle))
        log._write({"kind": RecordKind.HEADER.value, "version": FORMAT_VERSION, "config": asdict(config)})
        return log

    @classmethod
    def resume(cls, path: Path) -> tuple[RunLog, RunContents]:
        """Open an existing run to append to it, first cutting off a line torn by a kill. The lock is taken before
        anything is read, so a run still writing the file is never cut."""
        path = Path(path)
        try:
            handle = _locked(path, os.fdopen(os.open(path, os.O_WRONLY | os.O_APPEND), "ab"))  # never creates it
        except FileNotFoundError:
            raise RunFileError(f"{path}: no such run file to resume; start the run without --resume") from None
        try:
            contents, good_bytes = _parse(path)
            if good_bytes < path.stat().st_size:
                os.truncate(path, good_bytes)
        except BaseException:
            handle.close()
            raise
        return cls(path, handle), contents

    def append(self, record: RolloutRecord | TaskErrorRecord) -> None:
        kind = RecordKind.ROLLOUT if isinstance(record, RolloutRecord) else RecordKind.TASK_ERROR
        self._write({"kind": kind.value, **_plain(asdict(record))})

    def close(self) -> None:
        self._handle.close()

    def _write(self, entry: dict[str, Any]) -> None:
        self._handle.write(json.dumps(entry).encode() + b"\n")  # one write: a kill leaves whole lines or a torn last
        self._handle.flush()
        os.fsync(self._handle.fileno())


def _locked(path: Path, handle: BinaryIO) -> BinaryIO:
    """The handle, holding the run file's writer lock; refused while another process holds it."""
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise RunFileError(f"{path} is being written by another eval (it holds the file's lock): wait for that run to "
                           "end, or stop it, before resuming; or choose another --run-file") from None  # fmt: skip
    return handle


def read_run(path: Path) -> RunContents:
    """Every whole record in a run file (a torn last line is ignored, not cut off)."""
    return _parse(Path(path))[0]


def _parse(path: Path) -> tuple[RunContents, int]:
    """The records, and how many bytes of the file hold whole lines."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise RunFileError(f"{path}: no such run file to resume; start the run without --resume") from None
    good_bytes = data.rfind(b"\n") + 1
    lines = data[:good_bytes].splitlines()
    if not lines:
        raise RunFileError(f"{path}: empty, not an eval run file; delete it and start the run again")
    contents = RunContents(_record(path, 1, lines[0], RecordKind.HEADER))
    for number, line in enumerate(lines[1:], 2):
        record = _record(path, number, line, RecordKind.ROLLOUT, RecordKind.TASK_ERROR)
        if isinstance(record, RolloutRecord):
            contents.rollouts.append(record)
        else:
            contents.task_errors.append(record)
    return contents, good_bytes


def _record(path: Path, number: int, line: bytes, *kinds: RecordKind) -> Any:
    try:
        entry = json.loads(line)
        kind = RecordKind(entry.pop("kind"))
        if kind not in kinds:
            raise ValueError(f"a {kind.value} record where a {' or '.join(k.value for k in kinds)} belongs")
        if kind is RecordKind.HEADER:
            if entry.get("version") != FORMAT_VERSION:
                raise ValueError(f"format version {entry.get('version')!r}, this terminus-env reads {FORMAT_VERSION}")
            return RunConfig(**_config_fields(entry["config"]))
        if kind is RecordKind.ROLLOUT:
            return RolloutRecord(**entry)
        return TaskErrorRecord(**{**entry, "stage": TaskStage(entry["stage"])})
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RunFileError(f"{path}:{number}: not an eval run record ({exc}); was it edited by hand?") from exc


def _config_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """A header's run options as RunConfig takes them. A file written before the two switches were recorded holds
    only ``strict`` (what ``--strict`` asked): it stands for both."""
    options = {**raw, "names": tuple(raw["names"])}
    if "strict" in options:
        asked = bool(options.pop("strict"))
        options.setdefault("strict_format", asked)
        options.setdefault("strict_truncation", asked)
    return options


def _plain(value: Any) -> Any:
    """Enums as their values, so records are plain JSON."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value
