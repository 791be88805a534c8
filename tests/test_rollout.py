"""The rollout runner end to end: real sandboxes, simulated vLLM replicas over real HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

import pytest

from terminus_env import load_task
from terminus_env.records.metrics import aggregate
from terminus_env.rollout import OraclePolicy, RolloutRunner, ServingPolicy
from terminus_env.rollout.policy import OracleReplies, oracle_reply
from terminus_env.serving import ServingPool
from terminus_env.serving.sim.engine import SimConfig
from terminus_env.serving.sim.server import ServerConfig, SimServer

pytestmark = pytest.mark.usefixtures("docker_required")


@pytest.fixture(scope="module")
def task(tiny_task_dir):
    return load_task(tiny_task_dir)


@contextlib.asynccontextmanager
async def served(replies, replicas: int = 2, crash_on: str | None = None, **engine):
    """``replicas`` simulated vLLM servers behind one serving pool."""
    async with contextlib.AsyncExitStack() as stack:
        config = ServerConfig(model="sim", time_scale=0.0, engine=SimConfig(**engine), crash_on=crash_on)
        servers = [await stack.enter_async_context(SimServer(config, replies)) for _ in range(replicas)]
        pool = await stack.enter_async_context(ServingPool([s.url for s in servers], "sim"))
        yield pool


def test_oracle_policy_solves_a_group(task):
    runner = RolloutRunner(OraclePolicy(), env_kwargs={"mode": "eval"}, max_sandboxes=2)
    trajectories = asyncio.run(runner.run([task], group_size=2))
    assert [t.reward for t in trajectories] == [1.0, 1.0]
    assert len({t.group_id for t in trajectories}) == 1 and len({t.rollout_id for t in trajectories}) == 2
    assert trajectories[0].messages[0]["role"] == "user" and trajectories[0].turns[-1].format_error is None


def test_served_rollouts_are_sticky_and_carry_token_data(task):
    async def main():
        async with served(OracleReplies([task])) as pool:
            runner = RolloutRunner(ServingPolicy(pool, max_tokens=512), env_kwargs={"mode": "train"})
            return await runner.run([task], group_size=3)

    trajectories = asyncio.run(main())
    assert [t.reward for t in trajectories] == [1.0] * 3
    for t in trajectories:
        assert len({turn.replica for turn in t.turns}) == 1  # every turn stayed on its replica
        first = t.turns[0]
        assert first.token_ids and first.prompt_token_ids and first.logprobs
        assert len(first.token_ids) == first.completion_tokens == len(first.logprobs)


def test_strict_training_never_rescues_but_lenient_eval_does(task):
    broken_then_fine = lambda messages: (  # noqa: E731 - a reply source is any callable
        "I forgot the tags." if not any(m["role"] == "assistant" for m in messages)
        else oracle_reply(task, sum(m["role"] == "assistant" for m in messages) - 1)
    )

    async def run(mode: str):
        async with served(broken_then_fine, replicas=1) as pool:
            runner = RolloutRunner(ServingPolicy(pool, max_tokens=512), env_kwargs={"mode": mode})
            return await runner.run([task], group_size=2)

    strict = aggregate(asyncio.run(run("train")))
    assert (strict.mean_reward, strict.rescued_count, strict.mean_opening_streak) == (0.0, 0, 1.0)
    assert strict.end_reasons == {"format_error": 2}
    lenient = aggregate(asyncio.run(run("eval")))
    assert (lenient.mean_reward, lenient.rescued_count, lenient.rescued_rate) == (1.0, 2, 1.0)
    assert lenient.mean_format_errors == 1.0 and lenient.mean_opening_streak == 1.0


def test_context_overflow_at_the_server_becomes_context_limit(task):
    async def main():
        async with served(OracleReplies([task]), replicas=1, max_model_len=64) as pool:
            runner = RolloutRunner(ServingPolicy(pool, max_tokens=16), env_kwargs={"mode": "eval"})
            return await runner.run([task])

    (trajectory,) = asyncio.run(main())
    assert trajectory.summary.end_reason == "context_limit" and trajectory.reward == 0.0
    assert trajectory.turns[0].finish_reason == "context_length"


def test_a_sandbox_that_cannot_start_is_an_error_not_a_crash(task):
    broken = dataclasses.replace(task, docker_image="terminus-env/no-such-image:missing", build_context=None)
    runner = RolloutRunner(OraclePolicy(), env_kwargs={"mode": "eval"})
    (trajectory,) = asyncio.run(runner.run([broken]))
    assert trajectory.error and "no-such-image" in trajectory.error
    assert trajectory.masked and trajectory.env_error and trajectory.reward == 0.0  # the former name, one release


def test_a_request_that_kills_its_engine_fails_its_rollout_not_the_run(task):
    poison = dataclasses.replace(task, name="poison", instruction=task.instruction + " CRASH-THE-ENGINE")

    async def main():
        async with served(OracleReplies([task]), crash_on="CRASH-THE-ENGINE") as pool:
            runner = RolloutRunner(ServingPolicy(pool, max_tokens=512), env_kwargs={"mode": "train"})
            (failed,) = await runner.run([poison])
            return failed, await runner.run([task], group_size=2), pool

    failed, after, pool = asyncio.run(main())
    assert failed.error.startswith("EngineDied: replica ") and "not sent to another replica" in failed.error
    assert failed.masked and failed.reward == 0.0  # masked: no gradient from a rollout the fleet failed
    dead = failed.error.split()[2].removesuffix("'s")
    assert [t.reward for t in after] == [1.0, 1.0] and dead not in {turn.replica for t in after for turn in t.turns}
    assert not pool.is_up(dead) and pool.failovers == 0
