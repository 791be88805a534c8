"""``terminus-env eval`` over real Docker: broken tasks become rows, Ctrl-C and kills lose nothing, resume matches."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_support import containers_of_pid
from task_support import FAILURE, write_task

from terminus_env.cli import main as cli_main
from terminus_env.config import EVAL_STRICT_FORMAT, EVAL_STRICT_TRUNCATION
from terminus_env.records.report import build_report, print_report
from terminus_env.records.run_log import TaskStage, read_run
from terminus_env.rollout.policy import draw, request_seed
from terminus_env.sandbox.images import prune_task_images

pytestmark = pytest.mark.usefixtures("docker_required")

GOOD = ("eval-test-alpha", "eval-test-beta", "eval-test-gamma")
TRIALS = 2
SEED = "5"  # the flaky oracle's draws for these names: a mix of solved and unsolved trials


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Three good tasks in two categories, one whose task.toml does not parse, one whose image does not build."""
    root = tmp_path_factory.mktemp("eval-suite")
    for i, name in enumerate(GOOD):
        write_task(root, name, category="files" if i < 2 else "text")
    (write_task(root, "eval-test-broken-toml") / "task.toml").write_text("this is [not toml\n")
    write_task(root, "eval-test-broken-image", dockerfile_extra="RUN echo failing on purpose && exit 3\n")
    yield root
    prune_task_images({}, [root])  # every image built from this folder: none is needed any more


def eval_command(suite: Path, output: Path, *extra: str) -> list[str]:
    return ["eval", str(suite), "--flaky-oracle", SEED, "--trials", str(TRIALS), "--concurrency", "2",
            "--run-file", str(output), *extra]  # fmt: skip


def table(path: Path) -> str:
    contents = read_run(path)
    out = io.StringIO()
    print_report(build_report(contents), contents, out)
    return out.getvalue()


def rollout_lines(path: Path) -> int:
    try:
        return sum(1 for line in path.read_text().splitlines() if '"kind": "rollout"' in line)
    except FileNotFoundError:
        return 0


def start_cli(args: list[str], cwd: Path) -> subprocess.Popen[str]:
    """The CLI in a child process, with SIGINT as a terminal's Ctrl-C finds it (a background job ignores it)."""
    return subprocess.Popen([sys.executable, "-m", "terminus_env.cli", *args], cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip


def signal_after(child: subprocess.Popen[str], output: Path, rollouts: int, signum: int) -> tuple[int, str]:
    """Wait for ``rollouts`` finished rollouts in the run file, then send ``signum``; the exit code and output."""
    deadline = time.monotonic() + 240
    while child.poll() is None and rollout_lines(output) < rollouts and time.monotonic() < deadline:
        time.sleep(0.1)
    assert child.poll() is None, f"the eval ended before it could be interrupted:\n{child.communicate()[0]}"
    child.send_signal(signum)
    out, _ = child.communicate(timeout=120)
    return child.returncode, out


@pytest.fixture(scope="module")
def uninterrupted(suite: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, str]:
    output = tmp_path_factory.mktemp("eval-runs") / "whole.jsonl"
    child = start_cli(eval_command(suite, output), output.parent)
    out, _ = child.communicate(timeout=600)
    return output, child.returncode, out


def test_broken_tasks_are_rows_and_the_rest_runs(uninterrupted: tuple[Path, int, str]) -> None:
    output, code, out = uninterrupted
    assert code == 1, out  # broken tasks make the run fail, after running everything else
    total = 5 * TRIALS
    assert f"[{total}/{total}]" in out  # the progress count reaches its total
    assert "eval-test-broken-toml: could not load (2 trials not run): TaskError:" in out
    assert "eval-test-broken-image: could not build its image (2 trials not run): ImageBuildError:" in out
    contents = read_run(output)
    assert sorted(contents.finished()) == [(name, trial) for name in GOOD for trial in range(TRIALS)]
    assert {(e.task, e.stage) for e in contents.current_task_errors()} == {
        ("eval-test-broken-toml", TaskStage.LOAD), ("eval-test-broken-image", TaskStage.IMAGE)}  # fmt: skip
    report = build_report(contents)
    assert report.overall.tasks == 3
    assert report.overall.unscored == ("eval-test-broken-image", "eval-test-broken-toml")
    assert 0 < report.overall.mean_reward < 1, "pick a SEED whose draws mix solved and unsolved trials"
    assert set(report.categories) >= {"files", "text"}
    assert table(output) in out  # the printed table is the run file's
    assert "not scored (no valid trial): eval-test-broken-image, eval-test-broken-toml" in out
    assert "TOML syntax error" in out and "failing on purpose" in out  # each broken task shows its own error
    unsolved = [r for r in contents.rollouts if r.reward < 1]  # the flaky oracle gave up: the verifier says why
    assert unsolved and all(r.detail == FAILURE and r.summary["failure"] == FAILURE for r in unsolved)
    assert f": #{min(r.trial for r in unsolved if r.task == unsolved[0].task)} task_complete: {FAILURE}" in out


def test_a_killed_eval_resumes_to_the_same_final_table(suite: Path, uninterrupted: tuple[Path, int, str],
                                                        tmp_path: Path) -> None:  # fmt: skip
    output = tmp_path / "killed.jsonl"
    child = start_cli(eval_command(suite, output), tmp_path)
    code, _ = signal_after(child, output, 2, signal.SIGKILL)
    assert code == -signal.SIGKILL
    before = read_run(output)
    assert 2 <= len(before.rollouts) < len(GOOD) * TRIALS, "the kill came too late to test a resume"
    kept = output.read_bytes()[: output.read_bytes().rfind(b"\n") + 1]

    resumed = start_cli(eval_command(suite, output, "--resume"), tmp_path)
    out, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 1, out
    assert f"{len(before.rollouts)} already there" in out
    assert output.read_bytes().startswith(kept)  # what was saved stays, byte for byte
    after = read_run(output)
    assert len(after.rollouts) == len(after.finished()) == len(GOOD) * TRIALS  # nothing ran twice
    assert table(output) == table(uninterrupted[0])  # the same final table as the run never interrupted
    assert table(output) in out
    assert containers_of_pid(child.pid) == []  # the resumed run reaped what the killed one left


def test_ctrl_c_saves_a_consistent_file_and_leaves_no_container(suite: Path, tmp_path: Path) -> None:
    output = tmp_path / "interrupted.jsonl"
    child = start_cli(eval_command(suite, output), tmp_path)
    code, out = signal_after(child, output, 1, signal.SIGINT)
    assert code == 130, out
    assert "--resume" in out and "Traceback" not in out
    contents = read_run(output)  # every line parses
    assert output.read_bytes().endswith(b"\n") and len(contents.rollouts) >= 1
    assert containers_of_pid(child.pid) == []  # removed on the way out, not left to a reaper


def test_resume_refuses_other_options_and_keeps_the_file(suite: Path, uninterrupted: tuple[Path, int, str],
                                                         capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    output = uninterrupted[0]
    before = output.read_bytes()
    code = cli_main(["eval", str(suite), "--flaky-oracle", SEED, "--trials", "3", "--run-file", str(output),
                     "--resume"])  # fmt: skip
    assert code == 2 and "trials: 2 in the file, 3 now" in capsys.readouterr().err
    assert cli_main(eval_command(suite, output)) == 2  # a new run never overwrites a run file
    assert "--resume" in capsys.readouterr().err
    assert output.read_bytes() == before


def test_the_run_file_takes_one_writer(suite: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A second eval on a run file that a running eval writes (a --resume too early) is refused and changes nothing."""
    output = tmp_path / "busy.jsonl"
    child = start_cli(eval_command(suite, output, "--concurrency", "1"), tmp_path)
    deadline = time.monotonic() + 120
    while rollout_lines(output) < 1 and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert child.poll() is None, child.communicate()[0]
    before = output.read_bytes()
    assert cli_main(eval_command(suite, output, "--resume")) == 2
    assert "is being written by another eval" in capsys.readouterr().err
    assert output.read_bytes().startswith(before)  # nothing cut: the first eval goes on writing it
    out, _ = child.communicate(timeout=300)
    assert child.returncode == 1, out  # the broken tasks, as in an uninterrupted run
    assert len(read_run(output).rollouts) == len(GOOD) * TRIALS


def test_sampling_is_sent_as_asked_and_recorded(suite: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    output = tmp_path / "sampled.jsonl"
    args = ["eval", str(suite), "--name", GOOD[0], "--sim", "1", "--run-file", str(output), "--jobs-dir",
            str(tmp_path / "jobs"), "--temperature", "0.25", "--sampling", "top_k=5", "--sampling",
            "seed=3"]  # fmt: skip
    assert cli_main(args) == 0
    contents = read_run(output)
    config = contents.config
    assert config.sampling == {"temperature": 0.25, "top_k": 5, "seed": 3}
    assert (config.max_turns, config.summarize, config.summarize_threshold) == (None, True, 8000)  # Terminus 2's
    assert config.context_window == 32768  # the simulated replica's, as its /v1/models reports it
    trajectory = contents.rollouts[0].trajectory
    for index, turn in enumerate(trajectory["turns"]):  # the seed is a base: each request gets one of its own
        seed = request_seed(3, trajectory["rollout_id"], index)
        assert turn["sampling"] == {"max_tokens": 16384, "temperature": 0.25, "top_k": 5, "seed": seed}
    kwargs = json.loads((tmp_path / "jobs" / "sampled" / "config.json").read_text())["agents"][0]["kwargs"]
    assert kwargs["sampling"] == config.sampling and kwargs["enable_summarize"] is True
    assert cli_main(["eval", str(suite), "--sim", "1", "--run-file", str(tmp_path / "x.jsonl"), "--sampling",
                     "max_tokens=5"]) == 2  # fmt: skip
    assert "cannot set max_tokens" in capsys.readouterr().err
    assert cli_main(["eval", str(suite), "--sim", "1", "--run-file", str(tmp_path / "y.jsonl"), "--sampling",
                     "top_k"]) == 2  # fmt: skip
    assert "KEY=VALUE" in capsys.readouterr().err


def test_the_run_file_records_the_strictness_that_ran_and_a_resume_keeps_to_it(
    suite: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SWE_EVAL_STRICT_FORMAT makes a format error end the episode without --strict. The run file says so (both
    switches, as the envs ran them), the settings line too, and a resume under other semantics is refused with how
    to get the run's back."""
    monkeypatch.setenv(EVAL_STRICT_FORMAT, "1")
    output = tmp_path / "strict-format.jsonl"
    args = ["eval", str(suite), "--name", GOOD[0], "--flaky-oracle", SEED, "--trials", "2", "--run-file", str(output),
            "--jobs-dir", str(tmp_path / "jobs")]  # fmt: skip
    assert cli_main(args) == 0
    assert "eval: strict format, lenient truncation," in capsys.readouterr().out
    contents = read_run(output)
    assert (contents.config.strict_format, contents.config.strict_truncation) == (True, False)
    assert contents.config.summarize is False  # the env summarizes in lenient evaluation only
    careless = {r.trial: draw(int(SEED), "careless", f"{r.task}#{r.trial}") < 1 / 3 for r in contents.rollouts}
    assert sorted(careless.values()) == [False, True], "the seed must give one careless opening and one clean one"
    for rollout in contents.rollouts:  # the careless opening (a reply in no format) ended its episode: strict format
        ended_on_format = (rollout.end_reason, rollout.reward) == ("format_error", 0.0)
        assert ended_on_format == careless[rollout.trial], rollout.end_reason

    monkeypatch.delenv(EVAL_STRICT_FORMAT)
    before = output.read_bytes()
    assert cli_main([*args, "--resume"]) == 2
    err = capsys.readouterr().err
    assert "strict_format: True in the file, False now" in err
    assert f"{EVAL_STRICT_FORMAT}=1 {EVAL_STRICT_TRUNCATION}=0" in err and output.read_bytes() == before
    monkeypatch.setenv(EVAL_STRICT_FORMAT, "1")
    assert cli_main([*args, "--resume"]) == 0
    assert "2 already there" in capsys.readouterr().out
