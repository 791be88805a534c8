"""The final eval report, from a run file's records alone (no Docker)."""

from __future__ import annotations

import io

from terminus_env.records.report import build_report, print_report
from terminus_env.records.run_log import RolloutRecord, RunConfig, RunContents, TaskErrorRecord, TaskStage


def contents(trials: int, rewards: dict[str, list[float]], broken: tuple[str, ...] = ()) -> RunContents:
    config = RunConfig(folder="/suite", names=(), trials=trials, policy="oracle", strict_format=False,
                       strict_truncation=False, max_turns=30, max_turn_tokens=16384)  # fmt: skip
    run = RunContents(config)
    for task, values in rewards.items():
        for trial, reward in enumerate(values):
            detail = None if reward >= 1 else f"tests/test_{task}.py::test_it: AssertionError: trial {trial}"
            summary = {"reward": reward, "format_errors": 0, "format_error_opening_streak": 0, "truncated_turns": 0,
                       "turns": 2, "end_reason": "task_complete", "env_error": False}  # fmt: skip
            run.rollouts.append(RolloutRecord(task, trial, reward, "task_complete", False, category="git",
                                              detail=detail, summary=summary))  # fmt: skip
    for task in broken:
        run.task_errors.append(TaskErrorRecord(task, TaskStage.IMAGE, "ImageBuildError: exit 3\n--- log ---\nStep 1"))
    return run


def render(run: RunContents, order: list[str]) -> str:
    out = io.StringIO()
    print_report(build_report(run, order), run, out)
    return out.getvalue()


def test_the_report_shows_pass_at_k_the_interval_and_each_first_failure() -> None:
    run = contents(3, {"b": [0.0, 1.0, 0.0], "a": [1.0, 1.0, 1.0]}, broken=("c",))
    text = render(run, ["a", "b", "c"])
    lines = text.splitlines()
    assert lines[0].split() == ["task", "category", "trials", "solved", "pass@1", "pass@3", "mean", "reward", "end",
                                "reasons"]  # fmt: skip
    assert lines[2].split()[:7] == ["a", "git", "3", "3", "1.000", "1.000", "1.000"]
    assert lines[3].split()[:7] == ["b", "git", "3", "1", "0.333", "1.000", "0.333"]
    assert lines[4].split()[:3] == ["c", "-", "0"] and "image_error ×3" in lines[4]
    # Two tasks with p = 1 and 1/3 over 3 trials: se = sqrt(0 + (1/3)(2/3)/2) / 2 = 0.1667; 1.96 se = 0.327.
    assert "overall   2      0.667   1.000   0.667 ± 0.327 (0.340–0.993)" in text
    assert "  b: #0 task_complete: tests/test_b.py::test_it: AssertionError: trial 0" in text
    assert "  c: could not build its image: ImageBuildError: exit 3\n" in text  # the first line, not the build log
    assert "not scored (no valid trial): c" in text and "end reasons: task_complete 6, image_error 3" in text


def test_one_trial_per_task_says_once_why_there_is_no_interval() -> None:
    text = render(contents(1, {"a": [1.0], "b": [0.0]}), [])
    assert "pass@1" in text and "pass@1 " in text.splitlines()[0] and "pass@k" not in text
    assert "overall   2      0.500   0.500 ± n/a" in text
    assert text.count("no confidence interval: it needs 2 valid trials of every task") == 1
