"""``terminus-env eval --base-url`` with its defaults against a real vLLM replica whose context is 4,096 tokens: each
request asks for at most the context (the per-turn limit of 16,384 would be refused), a conversation that fills the
context is summarized instead of ending the episode, and the run ends when the task's time runs out."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from task_support import write_task
from vllm_support import MODEL_NAME, launch

from terminus_env.cli import main as cli_main
from terminus_env.rollout.run_log import read_run
from terminus_env.sandbox.images import prune_task_images

pytestmark = pytest.mark.usefixtures("docker_required")
CONTEXT = 4096
AGENT_TIMEOUT_S = 150


@pytest.fixture(scope="module")
def replica(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    fleet = launch(model_dir, tmp_path_factory.mktemp("small-context-logs"), dp=1,
                   engine_args=("--max-model-len", str(CONTEXT)))  # fmt: skip
    yield fleet.urls[0]
    fleet.stop()


def test_eval_with_its_defaults_runs_to_the_end_and_summarizes(replica: str, tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    toml = write_task(suite, "small-context") / "task.toml"
    toml.write_text(toml.read_text().replace("timeout_sec = 300", f"timeout_sec = {AGENT_TIMEOUT_S}"))
    output = tmp_path / "run.jsonl"
    try:
        code = cli_main(["eval", str(suite), "--base-url", replica, "--model", MODEL_NAME, "--output", str(output),
                         "--jobs-dir", str(tmp_path / "jobs")])  # fmt: skip
    finally:
        prune_task_images({}, [suite])
    assert code == 0  # no env error: the random model's reward is 0, and that is all
    contents = read_run(output)
    config = contents.config
    assert (config.context_window, config.max_turns, config.summarize, config.sampling) == (CONTEXT, None, True, {})
    (record,) = contents.rollouts
    assert record.end_reason == "agent_timeout"  # the task's time limit ended it, not a full context
    trajectory = record.trajectory
    assert all(turn["sampling"] == {"max_tokens": CONTEXT} for turn in trajectory["turns"])
    assert any(turn["finish_reason"] == "length" for turn in trajectory["turns"])  # replies ran to the context's end
    compactions = trajectory["compactions"]
    assert any(c["outcome"] != "failed" for c in compactions)  # the conversation was replaced, and went on
    assert record.summary["summarizations"] == sum(1 for c in compactions if c["outcome"] != "failed")
