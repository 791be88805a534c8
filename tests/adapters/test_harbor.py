"""Harbor reads what ``terminus-env eval`` writes: its ATIF validator passes every trajectory, its Pydantic models
load every ``config.json`` and ``result.json``, and its viewer's API serves the jobs, trials and trajectories.

Two real evals over Docker write into one jobs folder: the oracle served by a simulated vLLM replica (token counts,
token ids and logprobs on every turn) and the flaky oracle (a format error, a solved and an unsolved trial); both
suites hold a task that does not load. Needs ``pip install 'terminus-env[harbor]'`` (Python >= 3.12).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from harbor.models.job.config import JobConfig
from harbor.models.job.result import JobResult
from harbor.models.trajectories import Agent, Metrics, Observation, ObservationResult, Step, ToolCall, Trajectory
from harbor.models.trial.config import TrialConfig
from harbor.models.trial.result import TrialResult
from harbor.utils.trajectory_validator import TrajectoryValidator
from harbor.viewer.server import create_app
from task_support import BROKEN, TASK, TRIALS, eval_args, small_suite

from terminus_env.cli import main as cli_main
from terminus_env.records.run_log import read_run
from terminus_env.sandbox.images import prune_task_images

pytestmark = pytest.mark.usefixtures("docker_required")
TRIAL_NAMES = sorted(f"{task}__{trial}" for task in (TASK, BROKEN) for trial in range(TRIALS))


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("harbor")
    suite = small_suite(root)
    assert cli_main(eval_args(suite, root / "sim.jsonl", root / "jobs", "--sim", "1")) == 1  # the broken task
    assert cli_main(eval_args(suite, root / "flaky.jsonl", root / "jobs")) == 1
    yield root / "jobs"
    prune_task_images({}, [suite])


def trajectories(jobs: Path) -> list[Path]:
    return sorted(jobs.glob("*/*/agent/trajectory.json"))


def test_harbors_validator_passes_every_trajectory(jobs: Path) -> None:
    paths = trajectories(jobs)
    assert len(paths) == 2 * TRIALS  # every rollout of both runs; the broken task's trials have none
    for path in paths:
        validator = TrajectoryValidator()
        assert validator.validate(path), f"{path}: {validator.get_errors()}"
        Trajectory.model_validate_json(path.read_text())  # the models themselves, as every Harbor tool loads them


def test_the_served_run_keeps_token_counts_ids_and_logprobs(jobs: Path) -> None:
    records = {(r.task, r.trial): r for r in read_run(jobs.parent / "sim.jsonl").rollouts}
    for trial in range(TRIALS):
        document = Trajectory.model_validate_json((jobs / "sim" / f"{TASK}__{trial}" / "agent" / "trajectory.json")
                                                  .read_text())  # fmt: skip
        turns = records[(TASK, trial)].trajectory["turns"]
        agent_steps = [step for step in document.steps if step.source == "agent"]
        assert len(agent_steps) == len(turns) >= 3
        for step, turn in zip(agent_steps, turns, strict=True):
            metrics = step.metrics
            assert metrics is not None and metrics.prompt_tokens == turn["prompt_tokens"] > 0
            assert metrics.completion_token_ids == turn["token_ids"] and len(metrics.logprobs) == len(turn["token_ids"])
            assert metrics.prompt_token_ids == turn["prompt_token_ids"]
            assert step.message == turn["reply"]
        final = document.final_metrics
        assert final.total_prompt_tokens == sum(t["prompt_tokens"] for t in turns)
        assert final.total_completion_tokens == sum(t["completion_tokens"] for t in turns)
        result = TrialResult.model_validate_json((jobs / "sim" / f"{TASK}__{trial}" / "result.json").read_text())
        assert result.agent_result.n_input_tokens == final.total_prompt_tokens
        assert result.verifier_result.rewards == {"reward": 1.0} and result.reward_valid


def test_harbors_models_load_every_config_and_result(jobs: Path) -> None:
    for job in ("sim", "flaky"):
        config = JobConfig.model_validate_json((jobs / job / "config.json").read_text())
        assert config.job_name == job and config.n_attempts == TRIALS and config.agents[0].name == "terminus-env"
        result = JobResult.model_validate_json((jobs / job / "result.json").read_text())
        assert result.n_total_trials == 4 and result.finished_at is not None
        assert (result.stats.n_completed_trials, result.stats.n_errored_trials) == (4, 2)
        for name in TRIAL_NAMES:
            TrialConfig.model_validate_json((jobs / job / name / "config.json").read_text())
            trial = TrialResult.model_validate_json((jobs / job / name / "result.json").read_text())
            assert trial.trial_name == name and trial.config.job_id == result.id
            if name.startswith(BROKEN):
                assert trial.exception_info.exception_type == "TaskError" and not trial.reward_valid
    (evals,) = JobResult.model_validate_json((jobs / "flaky" / "result.json").read_text()).stats.evals.values()
    assert evals.reward_stats["reward"] == {1.0: [f"{TASK}__0"], 0.0: [f"{TASK}__1"]}


def test_harbors_viewer_serves_the_jobs_trials_and_trajectories(jobs: Path) -> None:
    with TestClient(create_app(jobs)) as client:
        listed = get(client, "/api/jobs")["items"]
        assert sorted(job["name"] for job in listed) == ["flaky", "sim"]
        assert all(job["n_completed_trials"] == 4 and job["agents"] == ["terminus-env"] for job in listed)
        trials = {t["name"]: t for t in get(client, "/api/jobs/flaky/trials")["items"]}
        assert sorted(trials) == TRIAL_NAMES
        assert (trials[f"{TASK}__0"]["reward"], trials[f"{TASK}__1"]["reward"]) == (1.0, 0.0)
        assert trials[f"{BROKEN}__0"]["error_type"] == "TaskError"
        steps = get(client, f"/api/jobs/flaky/trials/{TASK}__0/trajectory")["steps"]
        assert steps[1]["extra"]["format_error"]  # the flaky oracle's careless opening, as Harbor serves it
        assert steps[2]["tool_calls"][0]["arguments"]["keystrokes"].endswith("bash $S/solve.sh\n")
        assert get(client, f"/api/jobs/sim/trials/{TASK}__1")["verifier_result"] == {"rewards": {"reward": 1.0}}
        output = get(client, f"/api/jobs/flaky/trials/{TASK}__1/verifier-output")  # what failed, as Harbor shows it
        assert "test session starts" in output["stdout"] and "hello.txt is missing" in output["stdout"]
        assert "ended: task_complete" in client.get(f"/api/jobs/flaky/trials/{TASK}__1/files/trial.log").text


def test_view_renders_a_trajectory_shaped_as_harbors_terminus_2_writes_it(tmp_path: Path) -> None:
    """Built with Harbor's models in the shape its Terminus 2 agent fills: an ``Analysis:``/``Plan:`` message, one
    ``bash_command`` call, the terminal output as the observation."""
    trajectory = Trajectory(
        session_id="s", agent=Agent(name="terminus-2", version="2.0.0", model_name="some-model"),
        steps=[
            Step(step_id=1, source="user", message="Task: list /app", timestamp="2026-01-01T00:00:00+00:00"),
            Step(step_id=2, source="agent", message="Analysis: nothing listed yet\nPlan: run ls",
                 timestamp="2026-01-01T00:00:02+00:00",
                 tool_calls=[ToolCall(tool_call_id="call_0_1", function_name="bash_command",
                                      arguments={"keystrokes": "ls /app\n", "duration": 0.1})],
                 observation=Observation(results=[ObservationResult(source_call_id="call_0_1",
                                                                    content="New Terminal Output:\nnotes.txt")]),
                 metrics=Metrics(prompt_tokens=120, completion_tokens=30)),
        ],
    )  # fmt: skip
    trial = tmp_path / "list-app__AbC123"
    (trial / "agent").mkdir(parents=True)
    (trial / "agent" / "trajectory.json").write_text(json.dumps(trajectory.to_json_dict()))
    page = tmp_path / "page.html"
    assert cli_main(["view", str(trial), "--page", str(page)]) == 0
    text = page.read_text()
    assert "Analysis: nothing listed yet" in text and "ls /app⏎" in text and "notes.txt" in text
    assert "Turn 1" in text and "+2.0 s" in text and "120 tokens in" in text and "model some-model" in text


def get(client: TestClient, url: str) -> Any:
    response = client.get(url)
    assert response.status_code == 200, f"{url}: {response.status_code} {response.text[:500]}"
    return json.loads(response.text)
