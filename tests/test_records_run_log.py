"""The eval run file: records survive a kill, a resume refuses to mix runs, and broken tasks are retried."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from terminus_env.protocol import Strictness
from terminus_env.records.run_log import (
    FORMAT_VERSION,
    RolloutRecord,
    RunConfig,
    RunFileError,
    RunLog,
    TaskErrorRecord,
    TaskStage,
    read_run,
)

CONFIG = RunConfig(folder="/suite", names=(), trials=2, policy="oracle", strict_format=False,
                   strict_truncation=False, max_turns=30, max_turn_tokens=16384)  # fmt: skip


def record(task: str, trial: int, reward: float = 1.0) -> RolloutRecord:
    detail = None if reward else "tests/t.py::test_x: assert 0"
    return RolloutRecord(task=task, trial=trial, reward=reward, end_reason="task_complete", env_error=False,
                         category="git", detail=detail, wall_s=1.5, summary={"reward": reward},
                         trajectory={"messages": [{"role": "user", "content": "é"}]})  # fmt: skip


def test_records_round_trip_and_resume_skips_finished_rollouts(tmp_path: Path) -> None:
    path = tmp_path / "runs" / "run.jsonl"
    log = RunLog.create(path, CONFIG)
    log.append(record("a", 0))
    log.append(TaskErrorRecord("b", TaskStage.IMAGE, "ImageBuildError: exit 3", category="git"))
    log.close()
    log, contents = RunLog.resume(path)
    log.append(record("a", 1, reward=0.0))
    log.close()
    contents = read_run(path)
    assert contents.config == CONFIG
    assert contents.rollouts == [record("a", 0), record("a", 1, reward=0.0)]
    assert contents.finished() == {("a", 0), ("a", 1)}
    assert contents.task_errors == [TaskErrorRecord("b", TaskStage.IMAGE, "ImageBuildError: exit 3", category="git")]
    assert all(json.loads(line) for line in path.read_text().splitlines())  # plain JSON lines


def test_a_line_torn_by_a_kill_is_cut_off_on_resume(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    log = RunLog.create(path, CONFIG)
    log.append(record("a", 0))
    log.close()
    whole = path.read_bytes()
    path.write_bytes(whole + json.dumps({"kind": "rollout", "task": "a"}).encode()[:20])  # a write cut short
    assert read_run(path).finished() == {("a", 0)}  # reading ignores the torn line
    log, contents = RunLog.resume(path)
    log.append(record("a", 1))
    log.close()
    assert path.read_bytes().startswith(whole) and read_run(path).finished() == {("a", 0), ("a", 1)}


def test_a_new_run_never_overwrites_and_a_resume_needs_the_file(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    RunLog.create(path, CONFIG).close()
    before = path.read_bytes()
    with pytest.raises(RunFileError, match="--resume"):
        RunLog.create(path, CONFIG)
    assert path.read_bytes() == before
    with pytest.raises(RunFileError, match="without --resume"):
        RunLog.resume(tmp_path / "missing.jsonl")


def test_a_corrupt_or_foreign_file_is_refused_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text('{"some": "other file"}\n')
    with pytest.raises(RunFileError, match=r"run.jsonl:1: not an eval run record"):
        read_run(path)
    log = RunLog.create(tmp_path / "ok.jsonl", CONFIG)
    log.close()
    text = (tmp_path / "ok.jsonl").read_text() + "not json\n"
    (tmp_path / "ok.jsonl").write_text(text)
    with pytest.raises(RunFileError, match=r"ok.jsonl:2: .*edited by hand"):
        read_run(tmp_path / "ok.jsonl")


def test_config_differences_name_each_option() -> None:
    other = dataclasses.replace(CONFIG, trials=3, strict_format=True)
    assert other.differences(CONFIG) == ["trials: 2 in the file, 3 now", "strict_format: False in the file, True now"]
    assert CONFIG.differences(CONFIG) == []


def test_a_run_file_that_recorded_only_strict_reads_it_as_both_switches(tmp_path: Path) -> None:
    for asked in (False, True):
        header = {**dataclasses.asdict(CONFIG), "strict": asked}
        del header["strict_format"], header["strict_truncation"]
        path = tmp_path / f"asked-{asked}.jsonl"
        path.write_text(json.dumps({"kind": "header", "version": FORMAT_VERSION, "config": header}) + "\n")
        assert read_run(path).config.strictness == Strictness(asked, asked)


def test_a_task_fixed_before_the_resume_drops_its_old_error(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    log = RunLog.create(path, CONFIG)
    log.append(TaskErrorRecord("a", TaskStage.LOAD, "TaskError: first"))
    log.append(TaskErrorRecord("b", TaskStage.LOAD, "TaskError: old"))
    log.append(TaskErrorRecord("b", TaskStage.IMAGE, "ImageBuildError: new"))
    log.append(record("a", 0))
    log.close()
    assert read_run(path).current_task_errors() == [TaskErrorRecord("b", TaskStage.IMAGE, "ImageBuildError: new")]


def test_a_run_file_takes_one_writer(tmp_path: Path) -> None:
    """A second writer (a resume while the run goes on) is refused before it reads or cuts anything; the lock goes
    with the first writer."""
    path = tmp_path / "run.jsonl"
    log = RunLog.create(path, CONFIG)
    log.append(record("a", 0))
    with path.open("ab") as torn:
        torn.write(b'{"kind": "rollout", "task": "a", "tri')  # a record the first writer is in the middle of
    size = path.stat().st_size
    with pytest.raises(RunFileError, match="being written by another eval"):
        RunLog.resume(path)
    assert path.stat().st_size == size  # nothing was cut while the first writer holds the file
    log.close()
    log, contents = RunLog.resume(path)
    assert contents.finished() == {("a", 0)}
    with pytest.raises(RunFileError, match="being written by another eval"):
        RunLog.resume(path)
    log.close()
