"""An eval over real Docker also writes Harbor's job layout: the job's and each trial's config and result, the ATIF
trajectory and the asciinema recording of every rollout, and a trial for each trial a broken task could not run.
(Harbor's own validator and viewer read the same layout in tests/adapters/test_harbor.py.)"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyte
import pytest
from task_support import BROKEN, FAILURE, FLAKY_SEED, TASK, TRIALS, eval_args, small_suite

from terminus_env.cli import main as cli_main
from terminus_env.records.run_log import read_run
from terminus_env.sandbox.images import prune_task_images
from terminus_env.sandbox.terminal import HEIGHT, WIDTH

pytestmark = pytest.mark.usefixtures("docker_required")


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, int]]:
    """One flaky-oracle eval: the run file, its job folder, and the exit status."""
    root = tmp_path_factory.mktemp("harbor-job")
    suite = small_suite(root)
    code = cli_main(eval_args(suite, root / "run.jsonl", root / "jobs"))
    yield root / "run.jsonl", root / "jobs" / "run", code
    prune_task_images({}, [suite])


def test_every_trial_has_its_folder_and_the_job_its_counts(run: tuple[Path, Path, int]) -> None:
    output, job, code = run
    assert code == 1  # the broken task makes the run fail, after the rest ran
    trials = sorted(p.name for p in job.iterdir() if p.is_dir())
    assert trials == [f"{BROKEN}__0", f"{BROKEN}__1", f"{TASK}__0", f"{TASK}__1"]
    contents = read_run(output)
    for record in contents.rollouts:
        folder = job / f"{record.task}__{record.trial}"
        result = load(folder / "result.json")
        assert result["verifier_result"] == {"rewards": {"reward": record.reward}}
        assert result["agent_result"]["metadata"]["end_reason"] == record.end_reason
        assert result["exception_info"] is None and result["reward_valid"] is True
        assert load(folder / "config.json")["trial_name"] == folder.name == result["trial_name"]
        assert result["agent_execution"]["started_at"] <= result["verifier"]["started_at"]  # ISO times, in order
    for trial in range(TRIALS):  # a task that did not load: its trials never ran, as Harbor records an exception
        result = load(job / f"{BROKEN}__{trial}" / "result.json")
        assert result["exception_info"]["exception_type"] == "TaskError"
        assert "TOML syntax error" in result["exception_info"]["exception_message"]
        assert result["verifier_result"] is None and result["reward_valid"] is False
        assert not (job / f"{BROKEN}__{trial}" / "agent").exists()
    stats = load(job / "result.json")["stats"]
    assert load(job / "result.json")["n_total_trials"] == 4 and load(job / "result.json")["finished_at"]
    assert (stats["n_completed_trials"], stats["n_errored_trials"], stats["n_pending_trials"]) == (4, 2, 0)
    (evals,) = stats["evals"].values()
    assert evals["reward_stats"]["reward"] == {"1.0": [f"{TASK}__0"], "0.0": [f"{TASK}__1"]}
    assert evals["exception_stats"] == {"TaskError": [f"{BROKEN}__0", f"{BROKEN}__1"]}
    assert evals["metrics"] == [{"mean": 0.5}]
    config = load(job / "config.json")
    assert config["n_attempts"] == TRIALS and config["agents"][0]["name"] == "terminus-env"
    assert config["agents"][0]["kwargs"]["policy"] == f"flaky-oracle:{FLAKY_SEED}"


def test_each_trial_keeps_the_verifiers_output_and_a_log(run: tuple[Path, Path, int]) -> None:
    """What a person opens first when a trial fails: the verifier's output, its reward file, and what happened."""
    output, job, _ = run
    for record in read_run(output).rollouts:
        folder = job / f"{record.task}__{record.trial}"
        stdout = (folder / "verifier" / "test-stdout.txt").read_text()
        assert "test session starts" in stdout and stdout == record.trajectory["verifier"]["test-stdout.txt"]
        assert float((folder / "verifier" / "reward.txt").read_text()) == record.reward
        assert ("1 passed" in stdout) == (record.reward == 1.0)
        log = (folder / "trial.log").read_text().splitlines()
        assert log[0].endswith(f"{record.task} #{record.trial}: started") and log[0][:4].isdigit()  # stamped
        assert f"ended: task_complete after {len(record.trajectory['turns'])} turns" in "\n".join(log)
        if record.reward < 1:
            assert log[-1].endswith(f"failure: {FAILURE}") and "test_hello_file" in stdout
    assert not (job / f"{BROKEN}__0" / "verifier").exists()  # a task that never ran has no verifier output


def test_the_trajectory_holds_turns_keystrokes_screens_and_format_errors(run: tuple[Path, Path, int]) -> None:
    output, job, _ = run
    record = next(r for r in read_run(output).rollouts if r.trial == 0)
    turns = record.trajectory["turns"]
    document = load(job / f"{TASK}__0" / "agent" / "trajectory.json")
    assert document["schema_version"] == "ATIF-v1.7"
    steps = document["steps"]
    assert [s["step_id"] for s in steps] == list(range(1, len(turns) + 2))
    assert steps[0]["source"] == "user" and f"Task {TASK}: write the word hello" in steps[0]["message"]
    careless, solving = steps[1], steps[2]
    assert careless["extra"]["format_error"] and "tool_calls" not in careless  # nothing ran
    assert "parsing errors" in careless["observation"]["results"][0]["content"]  # the feedback it read
    (call,) = solving["tool_calls"]
    assert call["function_name"] == "bash_command"
    assert call["arguments"] == {"keystrokes": turns[1]["commands"][0]["keystrokes"], "duration": 60.0}
    assert call["arguments"]["keystrokes"].endswith("bash $S/solve.sh\n")
    assert solving["observation"]["results"][0]["source_call_id"] == call["tool_call_id"]
    assert "New terminal output:" in solving["observation"]["results"][0]["content"]
    last = steps[-1]
    assert [c["function_name"] for c in last["tool_calls"]] == ["bash_command", "mark_task_complete"]
    assert last["observation"]["results"][0]["content"] == turns[-1]["terminal"]["text"]  # the screen before grading
    assert document["extra"] == {"task": TASK, "trial": 0, "reward": 1.0, "end_reason": "task_complete"}
    stamps = [s["timestamp"] for s in steps]
    assert stamps == sorted(stamps)


def test_the_recording_replays_the_terminal_turn_by_turn(run: tuple[Path, Path, int]) -> None:
    output, job, _ = run
    record = next(r for r in read_run(output).rollouts if r.trial == 0)
    lines = (job / f"{TASK}__0" / "agent" / "recording.cast").read_text().splitlines()
    header = json.loads(lines[0])
    assert (header["version"], header["width"], header["height"]) == (2, WIDTH, HEIGHT)
    assert header["timestamp"] == int(record.trajectory["started_at"] + record.trajectory["ready_s"])
    events = [json.loads(line) for line in lines[1:]]
    times = [t for t, _, _ in events]
    assert times == sorted(times) and times[0] == 0.0
    turns = record.trajectory["turns"]
    assert [data for _, kind, data in events if kind == "m"] == [f"turn {n}" for n in range(1, len(turns) + 1)]
    typed = [c["keystrokes"] for turn in turns for c in turn["commands"]]
    assert [data for _, kind, data in events if kind == "i"] == typed
    shown = [data for _, kind, data in events if kind == "o"]
    assert record.trajectory["screen"].replace("\n", "\r\n") in shown[0]  # the first screen at time 0
    assert len(shown) == 1 + sum(1 for turn in turns if turn["terminal"] is not None)  # one frame per executed turn
    assert "bash $S/solve.sh" in shown[1] and "\r\n" in shown[1]


def test_a_terminal_replaying_the_recording_shows_what_tmux_showed(run: tuple[Path, Path, int]) -> None:
    """The solving turn's frame is new output only; replayed after the first screen in a real terminal emulator, it
    must give the screen tmux showed next (the confirming turn printed nothing, so the env sent the whole screen)."""
    output, job, _ = run
    terminals = [t["terminal"] for t in next(r for r in read_run(output).rollouts if r.trial == 0).trajectory["turns"]]
    assert terminals[0] is None and terminals[1]["is_screen"] is False and terminals[2]["is_screen"] is True
    lines = (job / f"{TASK}__0" / "agent" / "recording.cast").read_text().splitlines()
    screen = pyte.Screen(WIDTH, HEIGHT)
    terminal = pyte.Stream(screen)
    frames = [data for _, kind, data in map(json.loads, lines[1:]) if kind == "o"]
    for frame in frames[:2]:  # the first screen, then the solving turn's new output
        terminal.feed(frame)
    replayed = "\n".join(line.rstrip() for line in screen.display).rstrip()
    assert replayed == terminals[2]["text"].rstrip()
    assert "bash $S/solve.sh" in replayed


def test_a_resumed_run_writes_the_trials_its_job_lacks(run: tuple[Path, Path, int], tmp_path: Path) -> None:
    output, job, _ = run
    suite = Path(read_run(output).config.folder)
    shutil.rmtree(job / f"{TASK}__1")  # as if the run was killed between the run file and the trial folder
    before = load(job / "result.json")
    code = cli_main(eval_args(suite, output, job.parent, "--flaky-oracle", FLAKY_SEED, "--resume"))
    assert code == 1
    assert load(job / f"{TASK}__1" / "result.json")["verifier_result"] == {"rewards": {"reward": 0.0}}
    assert (job / f"{TASK}__1" / "agent" / "trajectory.json").is_file()
    after = load(job / "result.json")
    assert (after["id"], after["started_at"]) == (before["id"], before["started_at"])  # the same job, continued
    assert after["stats"]["evals"] == before["stats"]["evals"]


def test_a_new_run_never_overwrites_a_job_folder(run: tuple[Path, Path, int], tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    output, job, _ = run
    suite = Path(read_run(output).config.folder)
    other = tmp_path / "run.jsonl"  # a new run file whose name is the existing job's
    assert cli_main(eval_args(suite, other, job.parent)) == 2
    assert f"{job} exists" in capsys.readouterr().err
    assert not other.exists()  # nothing was started, nothing is left behind
