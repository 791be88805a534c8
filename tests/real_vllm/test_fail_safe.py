"""Two real CPU replicas with a small context (``small_fleet``): what a trainer must be able to trust of them.

- A checkpoint with a tensor missing, one of the wrong shape, or no folder at all is refused before any replica
  pauses; every replica serves the last good weights under the last good version, as ``transformers`` computes them.
- A load that fails halfway (the check skipped): vLLM 0.32 cannot reload at all after it, so the pool tags both
  replicas broken and leaves them paused, never resumed; ``serve`` restarts them, and the pool gives them the last
  good weights before they serve again. A load that fails before touching a layer leaves the replica serving.
- A new pool (a restarted trainer) carries on from the version the replicas report. (It knows no checkpoint for
  that version, so until its first sync a replica that fails to load is restarted rather than given it back.)
- Requests ask for at most the context: a reply cut where prompt and reply fill it ends ``context_limit`` in strict
  and lenient mode, and ``terminus-env eval`` run as ``serve`` printed it runs to the end with its defaults.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file, save_file
from vllm_support import (
    EVAL_AGENT_TIMEOUT_S,
    MODEL_NAME,
    PROMPT,
    SMALL_CONTEXT,
    START_TIMEOUT_S,
    TEST_TIMEOUT_S,
    eval_suite,
    expected_logprobs,
    perturbed,
)

from terminus_env.records.run_log import read_run
from terminus_env.rollout import RolloutRunner, ServingPolicy
from terminus_env.rules import EndReason
from terminus_env.sandbox.images import prune_task_images
from terminus_env.serving import ReplicaClient, ServingError, ServingPool
from terminus_env.serving.checkpoint import CheckpointError
from terminus_env.serving.weight_sync import BROKEN_TAG, CheckpointReload
from terminus_env.tasks import find_task

# A fleet's start and a restarted replica's return may come before a test's own work (vllm_support).
pytestmark = pytest.mark.timeout(TEST_TIMEOUT_S)
TENSOR = "model.layers.0.mlp.down_proj.weight"
EVAL_TIMEOUT_S = 420  # the eval below: its task's image, its time (EVAL_AGENT_TIMEOUT_S) and its verifier


@pytest.fixture(scope="module")
def step1(model_dir, tmp_path_factory):
    """A trainer's step on disk: the model and its folder."""
    folder = tmp_path_factory.mktemp("step-1")
    return perturbed(model_dir, folder, seed=11), folder


def edited(source, folder, change):
    """A copy of the checkpoint ``source`` with its tensors changed by ``change`` (a dict in, a dict out)."""
    folder.mkdir()
    for item in source.iterdir():
        if item.name != "model.safetensors":
            (folder / item.name).write_bytes(item.read_bytes())
    save_file(change(load_file(source / "model.safetensors")), folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def without(tensors):
    return {name: t for name, t in tensors.items() if name != TENSOR}


def reshaped(tensors):
    return {**tensors, TENSOR: torch.zeros(tensors[TENSOR].shape[0], tensors[TENSOR].shape[1] // 2)}


class Unchecked(CheckpointReload):
    """The reload with its check skipped: what vLLM does with a checkpoint nobody looked at."""

    async def check(self, served: str) -> None:
        return None


async def state(url: str, prompt_ids: list[int], token_ids: list[int]):
    """A replica's weight version, whether it is paused, and its logprobs of a fixed continuation."""
    async with ReplicaClient(url) as client:
        return (await client.weight_version(), await client.is_paused(),
                torch.tensor(await client.continuation_logprobs(MODEL_NAME, prompt_ids, token_ids)))  # fmt: skip


def assert_serves(states, model, prompt_ids, token_ids, version: str) -> None:
    expected = expected_logprobs(model, prompt_ids, token_ids)
    for tag, paused, got in states:
        assert tag == version and not paused
        assert torch.allclose(got, expected, atol=2e-3), (got, expected)


@pytest.fixture(scope="module")
def continuation(tokenizer):
    """A fixed prompt's first 200 tokens and a fixed continuation, whose logprobs say which weights a replica serves."""
    rendered = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer.encode(rendered, add_special_tokens=False)
    return prompt_ids[:200], tokenizer.encode(" write the output to the folder", add_special_tokens=False)


def test_bad_checkpoints_are_refused_before_any_replica_pauses(small_fleet, step1, tmp_path, continuation):
    model, folder = step1
    bad = {"missing": edited(folder, tmp_path / "missing", without),
           "reshaped": edited(folder, tmp_path / "reshaped", reshaped), "absent": tmp_path / "never-saved"}  # fmt: skip

    async def main():
        async with ServingPool(small_fleet.urls, MODEL_NAME) as pool:
            await pool.sync_weights(CheckpointReload(str(folder)), version=1)
            refused = {}
            for name, path in bad.items():
                with pytest.raises(CheckpointError) as error:
                    await pool.sync_weights(CheckpointReload(str(path)), version=2)
                refused[name] = str(error.value)
            async with pool.session("after"):
                after = await pool.chat("after", [{"role": "user", "content": "hello"}], max_tokens=4)
            states = [await state(url, *continuation) for url in small_fleet.urls]
            return refused, after, states, pool.policy_version

    refused, after, states, version = asyncio.run(main())
    assert f"1 tensor(s) missing: {TENSOR}" in refused["missing"]
    assert f"{TENSOR} [128, 128] (served: [128, 256])" in refused["reshaped"]
    assert "no such folder" in refused["absent"]
    assert all("No replica was touched" in text for text in refused.values())
    assert after.policy_version == 1 and version == 1
    assert_serves(states, model, *continuation, "1")
    log = "".join((small_fleet.log_dir / f"replica-{i}.log").read_text() for i in range(2))
    assert "were not loaded from checkpoint" not in log  # no mixed weights were ever loaded


def test_a_load_that_fails_before_touching_a_layer_leaves_every_replica_serving(
    small_fleet, step1, tmp_path, continuation
):
    model, folder = step1

    async def main():
        async with ServingPool(small_fleet.urls, MODEL_NAME) as pool:
            await pool.sync_weights(CheckpointReload(str(folder)), version=1)  # the weights it can give back
            with pytest.raises(ServingError, match="no replica took the weights of version 2") as error:
                await pool.sync_weights(Unchecked(str(tmp_path / "never-saved")), version=2)
            ups = [pool.is_up(url) for url in small_fleet.urls]
            states = [await state(url, *continuation) for url in small_fleet.urls]
            return str(error.value), ups, states, pool.policy_version

    error, ups, states, version = asyncio.run(main())
    assert error.count("serves version 1 again") == 2 and ups == [True, True] and version == 1
    assert_serves(states, model, *continuation, "1")


def test_a_load_that_fails_halfway_is_never_resumed_and_the_replicas_come_back_on_the_last_good_weights(
    small_fleet, step1, tmp_path, continuation
):
    model, folder = step1
    broken = edited(folder, tmp_path / "reshaped", reshaped)
    launcher_seen = len(small_fleet.launcher_log())  # the fleet is shared: what this test made the launcher say

    async def main():
        async with ServingPool(small_fleet.urls, MODEL_NAME, scrape_interval_s=0.5) as pool:
            await pool.sync_weights(CheckpointReload(str(folder)), version=1)
            with pytest.raises(ServingError, match="no replica took the weights of version 3") as error:
                await pool.sync_weights(Unchecked(str(broken)), version=3)
            tagged = []
            for url in small_fleet.urls:  # before the launcher's next look (every 2 s): tagged, paused, never resumed
                async with ReplicaClient(url) as client:
                    try:
                        tagged.append((await client.weight_version(), await client.is_paused()))
                    except ServingError:
                        tagged.append((BROKEN_TAG, True))  # already being restarted
            out = [pool.is_up(url) for url in small_fleet.urls]
            deadline = time.monotonic() + START_TIMEOUT_S
            while not all(pool.is_up(url) for url in small_fleet.urls) and time.monotonic() < deadline:
                await asyncio.sleep(1)
            async with pool.session("after"):
                after = await pool.chat("after", [{"role": "user", "content": "hello"}], max_tokens=4)
            states = [await state(url, *continuation) for url in small_fleet.urls]
            return str(error.value), tagged, out, after, states, pool.policy_version

    error, tagged, out, after, states, version = asyncio.run(main())
    assert error.count("left paused until it restarts") == 2
    assert tagged == [(BROKEN_TAG, True)] * 2 and out == [False, False]
    launcher = small_fleet.launcher_log()[launcher_seen:]
    for i, url in enumerate(small_fleet.urls):
        assert f"replica {i} ({url}) failed to load weights and could not take the last good ones back" in launcher
        assert "Cannot copy out of meta tensor" not in (small_fleet.log_dir / f"replica-{i}.log").read_text()
    assert "exited with code" not in launcher  # no request ever reached a broken engine
    assert after.policy_version == 1 and version == 1
    assert_serves(states, model, *continuation, "1")


def test_a_new_pool_carries_on_from_the_version_the_replicas_hold(small_fleet):
    async def main():
        async with ServingPool(small_fleet.urls, MODEL_NAME) as pool, pool.session("s"):
            return pool.policy_version, (await pool.chat("s", [{"role": "user", "content": "hi"}], max_tokens=2))

    version, completion = asyncio.run(main())
    assert version == 1 and completion.policy_version == 1 and completion.max_model_len == SMALL_CONTEXT


@pytest.mark.usefixtures("docker_required")
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_a_reply_cut_where_it_fills_the_context_ends_context_limit(small_fleet, mode):
    """The per-turn limit far above the context: the request asks for what fits, and the reply cut there ends the
    episode context_limit (the next turn cannot fit), not turn_truncated, strict and lenient alike, where the agent
    loop does not summarize (eval's default loop does: see the next test)."""

    async def main():
        async with ServingPool(small_fleet.urls, MODEL_NAME) as pool:
            policy = ServingPolicy(pool, max_tokens=16384, sampling={"ignore_eos": True, "temperature": 1.0})
            runner = RolloutRunner(policy, env_kwargs={"mode": mode, "max_turn_tokens": 16384}, max_sandboxes=1)
            return await runner.run([find_task("hello-world")])

    (trajectory,) = asyncio.run(main())
    assert trajectory.error is None, trajectory.error
    (turn,) = trajectory.turns
    assert turn.finish_reason == "length" and len(turn.prompt_token_ids) + len(turn.token_ids) == SMALL_CONTEXT
    assert trajectory.summary.end_reason is EndReason.CONTEXT_LIMIT and trajectory.reward == 0.0


@pytest.mark.usefixtures("docker_required")
def test_eval_as_serve_printed_it_runs_to_the_end_with_its_defaults(small_fleet, tmp_path):
    printed = small_fleet.lines[-1]
    assert printed.startswith("evaluate with: terminus-env eval --model tiny --base-url ")
    command = printed.removeprefix("evaluate with: terminus-env ").split()
    run_file = tmp_path / "run.jsonl"
    suite = eval_suite(tmp_path / "suite", "printed-command")  # a task whose time is EVAL_AGENT_TIMEOUT_S
    try:
        done = subprocess.run([sys.executable, "-m", "terminus_env.cli", *command, str(suite), "--run-file",
                               str(run_file), "--jobs-dir", str(tmp_path / "jobs")],
                              capture_output=True, text=True, timeout=EVAL_TIMEOUT_S)  # fmt: skip
    finally:
        prune_task_images({}, [suite])
    assert done.returncode == 0, done.stderr[-3000:]
    (rollout,) = read_run(run_file).rollouts
    # Its loop summarizes when the context fills, as Terminus 2 does, so the run goes on until the task's time is up.
    assert not rollout.env_error and rollout.end_reason == "agent_timeout", (rollout.end_reason, rollout.detail)
    assert rollout.summary["summarizations"] > 0
    print(f"\neval with its defaults against a {SMALL_CONTEXT}-token replica: {rollout.end_reason} after "
          f"{len(rollout.trajectory['turns'])} turns of a task with {EVAL_AGENT_TIMEOUT_S} s")  # fmt: skip
