"""Harbor 0.26's own Terminus 2 agent and ``terminus-env eval`` on the same served policy and the same tasks
(``bench/harbor_side_by_side.py --quick``): the scores agree, every trial plays the same turns and ends the same
way, and the task whose conversation overflows the context is summarized and carries on in both.

Needs ``.venv-harbor`` (``pip install 'terminus-env[harbor]'``), Docker and Compose v2 (``scripts/ensure-compose.sh``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import harbor_side_by_side as bench
import pytest
from harbor.utils.trajectory_validator import TrajectoryValidator

from terminus_env.records.run_log import read_run

# Harbor takes 30-60 s a trial here (Compose's start and stop), 8 trials: 5 min on a quiet machine, 11 on a busy one.
pytestmark = [pytest.mark.usefixtures("docker_required"), pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("side-by-side")
    code = bench.main(["--quick", "--output", str(out)])
    document = json.loads((out / "results.json").read_text())
    assert code == 0, (out / "table.md").read_text()  # the scores' 95% intervals overlap in every run
    return out, document


def by_task(trials: list[dict[str, Any]], key: str) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for trial in trials:
        out.setdefault(trial["task"], []).append(trial[key])
    return {task: sorted(values) for task, values in out.items()}


def test_the_same_policy_scores_the_same_under_both_harnesses(results: tuple[Path, dict[str, Any]]) -> None:
    _, document = results
    run = document["defaults"]
    assert run["agree"]
    assert sorted({t["task"] for t in run["harbor"]}) == sorted(bench.QUICK_TASKS)
    assert by_task(run["harbor"], "reward") == by_task(run["ours"], "reward")  # the k-th episode draws the same
    assert by_task(run["harbor"], "turns") == by_task(run["ours"], "turns")
    assert by_task(run["harbor"], "format_errors") == by_task(run["ours"], "format_errors")
    for side in ("harbor", "ours"):
        assert {t["end"] for t in run[side]} == {"task_complete"}  # no turn cap, no error: completion confirmed
        assert {t["confirmations"] for t in run[side]} == {2}  # marked complete, asked, confirmed


def test_an_overflowing_conversation_is_summarized_and_carries_on_in_both(results: tuple[Path, dict[str, Any]]) -> None:
    out, document = results
    for label in ("defaults", "proactive off"):
        run = document[label]
        for side in ("harbor", "ours"):
            overflow = [t for t in run[side] if t["task"] == bench.OVERFLOW_TASK]
            assert overflow and all(t["summarizations"] >= 1 and t["end"] == "task_complete" for t in overflow)
        assert by_task(run["harbor"], "reward") == by_task(run["ours"], "reward")
    triggers = {c["trigger"] for r in read_run(out / "ours" / "reactive.jsonl").rollouts
                for c in r.trajectory["compactions"]}  # fmt: skip
    assert triggers == {"reactive"}  # with the proactive summary off, only the server's refusal summarizes


def test_harbors_validator_passes_our_summarized_trajectories(results: tuple[Path, dict[str, Any]]) -> None:
    out, _ = results
    summaries = sorted((out / "ours" / "jobs").glob("*/*/agent/trajectory.summarization-*.json"))
    assert summaries  # the three requests of each summarization, beside the main trajectory
    for path in [*summaries, *(out / "ours" / "jobs").glob("*/*/agent/trajectory.json")]:
        validator = TrajectoryValidator()
        assert validator.validate(path), f"{path}: {validator.get_errors()}"
