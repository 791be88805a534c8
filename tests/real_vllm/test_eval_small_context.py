"""``terminus-env eval --base-url`` with its defaults against a real vLLM replica whose context is small
(``SMALL_CONTEXT``, 1,024 tokens): each request asks for at most the context (the per-turn limit of 16,384 would be
refused), a conversation that fills the context is summarized instead of ending the episode, and the run ends when
the task's time runs out."""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_support import EVAL_AGENT_TIMEOUT_S, MODEL_NAME, SMALL_CONTEXT, TEST_TIMEOUT_S, eval_suite

from terminus_env.cli import main as cli_main
from terminus_env.records.run_log import read_run
from terminus_env.sandbox.images import prune_task_images

# A fleet's start and a restarted replica's return may come before a test's own work (vllm_support).
pytestmark = [pytest.mark.usefixtures("docker_required"), pytest.mark.timeout(TEST_TIMEOUT_S)]


def test_eval_with_its_defaults_runs_to_the_end_and_summarizes(small_fleet, tmp_path: Path) -> None:
    suite = eval_suite(tmp_path / "suite", "small-context")
    output = tmp_path / "run.jsonl"
    try:
        code = cli_main(["eval", str(suite), "--base-url", small_fleet.urls[0], "--model", MODEL_NAME, "--run-file",
                         str(output), "--jobs-dir", str(tmp_path / "jobs")])  # fmt: skip
    finally:
        prune_task_images({}, [suite])
    assert code == 0  # no env error: the random model's reward is 0, and that is all
    contents = read_run(output)
    config = contents.config
    assert (config.context_window, config.max_turns, config.summarize) == (SMALL_CONTEXT, None, True)
    assert config.sampling == {}
    (record,) = contents.rollouts
    assert record.end_reason == "agent_timeout"  # the task's time limit ended it, not a full context
    trajectory = record.trajectory
    assert all(turn["sampling"] == {"max_tokens": SMALL_CONTEXT} for turn in trajectory["turns"])
    assert any(turn["finish_reason"] == "length" for turn in trajectory["turns"])  # replies ran to the context's end
    compactions = trajectory["compactions"]
    assert any(c["outcome"] != "failed" for c in compactions)  # the conversation was replaced, and went on
    assert record.summary["summarizations"] == sum(1 for c in compactions if c["outcome"] != "failed")
    first = min(c["at_s"] for c in compactions if c["outcome"] != "failed")
    print(f"\nthe first summary {first:.1f} s into the task's {EVAL_AGENT_TIMEOUT_S} s")
