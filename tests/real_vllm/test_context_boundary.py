"""A conversation that fills a real vLLM replica's context to its last token, on purpose (the small fleet, whose
context is ``SMALL_CONTEXT``): the task's instruction is padded until its first prompt, as the replica's own
``/tokenize`` counts it, is exactly the context, or one token short of it. vLLM refuses the first with "max_tokens
must be at least 1, got 0" and grants the second one token. Both are the agent's ``context_limit``, never a masked
serving error: through the env (strict and lenient) and through ``terminus-env eval`` (lenient, whose loop tries to
summarize first, and strict). Every outcome here is fixed by the prompt's length, not by what the random model
says: every reply ignores the end token, so its length is the room it is given."""

from __future__ import annotations

import asyncio

import pytest
from boundary_support import boundary_task, first_messages, padded
from vllm_support import MODEL_NAME, SMALL_CONTEXT, TEST_TIMEOUT_S, wait_serving

from terminus_env import load_task
from terminus_env.cli import main as cli_main
from terminus_env.records.run_log import read_run
from terminus_env.rollout import RolloutRunner, ServingPolicy
from terminus_env.rules import EndReason
from terminus_env.sandbox.images import prune_task_images
from terminus_env.serving import ReplicaClient, ServingPool

pytestmark = [pytest.mark.usefixtures("docker_required"), pytest.mark.timeout(TEST_TIMEOUT_S)]


def measure(url: str, messages: list[dict]) -> int:
    async def main():
        async with ReplicaClient(url) as client:
            return await client.prompt_tokens(MODEL_NAME, messages)

    return asyncio.run(main())


@pytest.fixture(scope="module")
def boundary(small_fleet_process, tmp_path_factory):
    """The fleet, and the tasks whose first prompt is exactly its context ("full") or one token less ("short")."""
    wait_serving(small_fleet_process)
    url = small_fleet_process.urls[0]
    root = tmp_path_factory.mktemp("boundary")
    opening = first_messages(boundary_task(root / "measure", 0))
    padding = SMALL_CONTEXT - measure(url, opening)  # each filler word is one token of this tokenizer
    assert padding > 1, "the unpadded task's first prompt already fills the context"
    assert measure(url, padded(opening, padding)) == SMALL_CONTEXT  # on the boundary, as the engine counts
    assert measure(url, padded(opening, padding - 1)) == SMALL_CONTEXT - 1
    tasks = {"full": boundary_task(root / "full", padding), "short": boundary_task(root / "short", padding - 1)}
    yield small_fleet_process, tasks
    prune_task_images({}, [root / "measure", root / "full", root / "short"])


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("where", ["full", "short"])
def test_a_first_prompt_on_the_boundary_is_the_agents_context_limit(boundary, mode, where):
    fleet, tasks = boundary

    async def main():
        async with ServingPool(fleet.urls, MODEL_NAME) as pool:
            policy = ServingPolicy(pool, max_tokens=16384, sampling={"ignore_eos": True})
            runner = RolloutRunner(policy, env_kwargs={"mode": mode, "max_turn_tokens": 16384}, max_sandboxes=1)
            (trajectory,) = await runner.run([load_task(tasks[where])])
            return trajectory

    trajectory = asyncio.run(main())
    assert trajectory.error is None, trajectory.error
    assert trajectory.summary.end_reason is EndReason.CONTEXT_LIMIT and not trajectory.masked
    assert trajectory.reward == 0.0
    (turn,) = trajectory.turns
    if where == "full":
        assert turn.finish_reason == "context_length"
        assert measure(fleet.urls[0], trajectory.messages[:-1]) == SMALL_CONTEXT  # the prompt vLLM refused
    else:
        assert (turn.prompt_tokens, turn.completion_tokens, turn.finish_reason) == (SMALL_CONTEXT - 1, 1, "length")


@pytest.mark.parametrize("options", [(), ("--strict",)], ids=["lenient", "strict"])
@pytest.mark.parametrize("where", ["full", "short"])
def test_eval_ends_a_first_prompt_on_the_boundary_context_limit(boundary, tmp_path, where, options):
    """``terminus-env eval`` with its defaults: lenient, its loop summarizes first, as Terminus 2 does, but even its
    last fallback (the task and the screen's end) starts from the first message, which fills the context; strict
    ends at once. The eval exits 0: nothing the infrastructure did."""
    fleet, tasks = boundary
    run_file = tmp_path / "run.jsonl"
    code = cli_main(["eval", str(tasks[where].parent), "--base-url", fleet.urls[0], "--model", MODEL_NAME,
                     "--run-file", str(run_file), "--jobs-dir", str(tmp_path / "jobs"), "--sampling", "ignore_eos=true",
                     *options])  # fmt: skip
    (rollout,) = read_run(run_file).rollouts
    assert code == 0 and not rollout.env_error, rollout.detail
    assert rollout.end_reason == "context_limit" and rollout.reward == 0.0
    compactions = rollout.trajectory["compactions"]
    if options:
        assert not compactions  # strict never summarizes
    else:
        assert compactions and all(c["trigger"] == "reactive" or c["outcome"] == "failed" for c in compactions)
