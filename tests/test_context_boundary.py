"""A conversation that fills the context to its last token, on purpose, against the simulated replica (which answers at
the boundary as vLLM 0.32 does): exactly full, the engine refuses with "max_tokens must be at least 1, got 0"; one
token short, it grants one token and the reply ends ``length`` with the context full. Either way the episode is the
agent's ``context_limit`` (reward 0, never masked), or, where the eval's loop summarizes, a summary that carries on:
through the env (the rollout runner, strict and lenient) and through ``terminus-env eval``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from boundary_support import NO_COMMAND, boundary_task, first_messages
from serving_support import SimProcesses

from terminus_env import load_task
from terminus_env.cli import main as cli_main
from terminus_env.records.run_log import read_run
from terminus_env.rollout import RolloutRunner, ServingPolicy
from terminus_env.rules import EndReason
from terminus_env.serving import ServingPool
from terminus_env.serving.sim.engine import SimConfig
from terminus_env.serving.sim.server import ServerConfig, SimServer
from terminus_env.serving.sim.tokenizer import encode_chat

pytestmark = pytest.mark.usefixtures("docker_required")
PADDING = 40  # filler words in the exactly-full task: the context is the unpadded first prompt and these
EVAL_TURNS = 12  # the eval's dry run: enough turns that a summary of the first message fits the context


@pytest.fixture(scope="module")
def boundary(tmp_path_factory) -> tuple[int, dict[str, Path]]:
    """The context, and the tasks whose first prompt is exactly that context ("full") or one token less ("short")."""
    root = tmp_path_factory.mktemp("boundary")
    context = len(encode_chat(first_messages(boundary_task(root / "measure", 0)))) + PADDING
    tasks = {"full": boundary_task(root / "full", PADDING), "short": boundary_task(root / "short", PADDING - 1)}
    return context, tasks


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("where", ["full", "short"])
def test_a_first_prompt_on_the_boundary_is_the_agents_context_limit(boundary, mode, where):
    context, tasks = boundary
    task = load_task(tasks[where])

    async def main():
        config = ServerConfig(model="sim", time_scale=0.0, engine=SimConfig(max_model_len=context))
        async with SimServer(config) as server, ServingPool([server.url], "sim") as pool:
            runner = RolloutRunner(ServingPolicy(pool, max_tokens=16384), env_kwargs={"mode": mode}, max_sandboxes=1)
            (trajectory,) = await runner.run([task])
            return trajectory, pool.is_up(server.url)

    trajectory, up = asyncio.run(main())
    assert trajectory.error is None, trajectory.error  # not a serving error: nothing for a trainer to mask
    assert trajectory.summary.end_reason is EndReason.CONTEXT_LIMIT and not trajectory.masked
    assert trajectory.reward == 0.0 and up
    (turn,) = trajectory.turns
    if where == "full":
        refused, reply = trajectory.messages[:-1], trajectory.messages[-1]  # the env keeps the empty reply
        assert len(encode_chat(refused)) == context and reply == {"role": "assistant", "content": ""}
        assert turn.finish_reason == "context_length" and turn.reply == ""
    else:
        assert (turn.prompt_tokens, turn.completion_tokens, turn.finish_reason) == (context - 1, 1, "length")


def evaluate(suite: Path, url: str, tmp: Path, *extra: str):
    """``terminus-env eval`` of ``suite`` against the server at ``url``, as a user runs it: exit code, rollout."""
    run_file = tmp / "run.jsonl"
    code = cli_main(["eval", str(suite), "--base-url", url, "--model", "sim", "--run-file", str(run_file),
                     "--jobs-dir", str(tmp / "jobs"), *extra])  # fmt: skip
    (rollout,) = read_run(run_file).rollouts
    return code, rollout


@pytest.fixture(scope="module")
def eval_boundary(boundary, tmp_path_factory) -> tuple[Path, Path, list[int]]:
    """The unpadded task's suite, the replies file (replies that run nothing), and the prompt of each of the eval's
    first ``EVAL_TURNS`` turns against a context too large to matter (a dry run)."""
    root = tmp_path_factory.mktemp("eval-boundary")
    suite = boundary_task(root / "suite", 0).parent
    replies = root / "replies.jsonl"
    replies.write_text(json.dumps({"reply": NO_COMMAND}) + "\n")
    servers = SimProcesses(root)
    try:
        _, url = servers.start("--model", "sim", "--time-scale", "0", "--replies", str(replies))
        code, rollout = evaluate(suite, url, root, "--max-turns", str(EVAL_TURNS), "--summarize-threshold", "0")
    finally:
        servers.close()
    assert code == 0 and rollout.end_reason == "max_turns"
    return suite, replies, [turn["prompt_tokens"] for turn in rollout.trajectory["turns"]]


@pytest.mark.parametrize("where", ["full", "short"])
def test_eval_summarizes_a_conversation_that_reaches_the_boundary_and_goes_on(eval_boundary, tmp_path, where):
    """The last turn of the dry run on the boundary: exactly full, its request is refused; one short, its reply is a
    token that fills the context and the next request is refused. The eval's loop summarizes, as Terminus 2 does,
    and the episode goes on to its turn limit; the eval exits 0."""
    suite, replies, prompts = eval_boundary
    last = prompts[-1]
    context = last if where == "full" else last + 1
    servers = SimProcesses(tmp_path)
    try:
        _, url = servers.start("--model", "sim", "--time-scale", "0", "--replies", str(replies), "--max-model-len",
                               str(context))  # fmt: skip
        code, rollout = evaluate(suite, url, tmp_path, "--max-turns", str(EVAL_TURNS + 3), "--summarize-threshold",
                                 "0")  # fmt: skip
    finally:
        servers.close()
    assert code == 0 and not rollout.env_error, rollout.detail
    assert rollout.end_reason == "max_turns"
    turns, compactions = rollout.trajectory["turns"], rollout.trajectory["compactions"]
    assert [turn["prompt_tokens"] for turn in turns[: len(prompts) - 1]] == prompts[:-1]  # the same road to it
    first = compactions[0]
    assert first["trigger"] == "reactive" and first["outcome"] == "summary"
    if where == "full":
        assert first["turn"] == len(prompts) - 1  # refused at the boundary's turn, before any reply to it
    else:
        at_boundary = turns[len(prompts) - 1]
        assert (at_boundary["prompt_tokens"], at_boundary["completion_tokens"]) == (context - 1, 1)
        assert at_boundary["finish_reason"] == "length" and first["turn"] == len(prompts)
    assert rollout.summary["summarizations"] >= 1


def test_strict_eval_ends_a_conversation_that_reaches_the_boundary_context_limit(eval_boundary, tmp_path):
    suite, replies, prompts = eval_boundary
    servers = SimProcesses(tmp_path)
    try:
        _, url = servers.start("--model", "sim", "--time-scale", "0", "--replies", str(replies), "--max-model-len",
                               str(prompts[-1]))  # fmt: skip
        code, rollout = evaluate(suite, url, tmp_path, "--strict", "--max-turns", str(EVAL_TURNS + 3))
    finally:
        servers.close()
    assert code == 0 and not rollout.env_error, rollout.detail
    assert rollout.end_reason == "context_limit" and rollout.reward == 0.0
    assert len(rollout.trajectory["turns"]) == len(prompts)  # ended at the boundary's turn
