"""SkyRL: TerminusGenerator's step-wise output through SkyRL's own validator, and the skyrl_gym text env.

Real Docker episodes; replies from the simulated vLLM replica, tokenized by a ChatML tokenizer built
here. Needs ``pip install 'terminus-env[skyrl]'`` on Python >= 3.12.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

import pytest
import skyrl_gym
from adapter_support import HalfRight, oracle_server
from skyrl.train.generators.base import BatchMetadata, GeneratorInput, TrajectoryID
from skyrl.train.utils.trainer_utils import validate_generator_output

from terminus_env.integrations.skyrl import ENV_ID, TerminusGenerator, TerminusTextEnv, register
from terminus_env.rollout import ServingPolicy
from terminus_env.rollout.policy import oracle_reply
from terminus_env.serving import ServingPool
from terminus_env.training import MaskingPolicy

pytestmark = pytest.mark.usefixtures("docker_required")


def batch(task, instances: list[str], group: int) -> GeneratorInput:
    n = len(instances) * group
    return GeneratorInput(
        prompts=[[{"role": "user", "content": task.instruction}]] * n,
        env_classes=[ENV_ID] * n,
        env_extras=[{"task": task.name}] * n,
        sampling_params=None,
        trajectory_ids=[TrajectoryID(instance, r) for instance in instances for r in range(group)],
        batch_metadata=BatchMetadata(global_step=7, training_phase="train"),
    )


def generate(tasks, tokenizer, input_batch, masking=None, replies=None, max_tokens=2048):
    async def main():
        async with contextlib.AsyncExitStack() as stack:
            server = await stack.enter_async_context(oracle_server(tasks, tokenizer, replies or HalfRight(tasks)))
            pool = await stack.enter_async_context(ServingPool([server.url], "sim"))
            kwargs = {"masking": masking} if masking else {}
            generator = TerminusGenerator(ServingPolicy(pool, max_tokens=max_tokens), tasks, **kwargs)
            return generator, await generator.generate(input_batch)

    return asyncio.run(main())


def test_step_wise_rows_pass_skyrls_validator(task, tokenizer):
    input_batch = batch(task, ["a", "b"], group=2)
    generator, output = generate([task], tokenizer, input_batch)
    validate_generator_output(len(input_batch["prompts"]), output, step_wise=True)

    trajectories = generator.last_trajectories
    assert sorted(t.reward for t in trajectories) == [0.0, 0.0, 1.0, 1.0]  # every other episode is right
    assert {t.group_id for t in trajectories} == {"a", "b"}
    rows = sum(len(t.turns) for t in trajectories)
    assert len(output["response_ids"]) == rows and sum(output["is_last_step"]) == 4
    start = 0
    for trajectory in trajectories:
        end = start + len(trajectory.turns)
        assert [tid.to_string() for tid in output["trajectory_ids"][start:end]] == [trajectory.rollout_id] * (
            end - start
        )
        for k, turn in enumerate(trajectory.turns):  # each row is exactly what the engine saw and generated
            assert output["prompt_token_ids"][start + k] == turn.prompt_token_ids
            assert output["response_ids"][start + k] == turn.token_ids
            assert output["rollout_logprobs"][start + k] == turn.logprobs
            assert turn.policy_version == 7  # batch_metadata.global_step
        assert output["rewards"][end - 1][-1] == trajectory.reward
        assert sum(map(sum, output["rewards"][start : end - 1])) == 0
        assert all(all(m == 1 for m in mask) for mask in output["loss_masks"][start:end])
        start = end
    assert output["rollout_metrics"]["terminus/mean_reward"] == 0.5


def test_an_env_error_masks_its_whole_group_as_skyrls_harbor_integration_does(task, tokenizer):
    missing = "terminus-env/does-not-exist:never"
    broken = dataclasses.replace(task, name="broken", docker_image=missing, build_context=None)
    input_batch = batch(task, ["a"], group=2)
    input_batch["trajectory_ids"] += [TrajectoryID("b", 0), TrajectoryID("b", 1)]
    for key in ("prompts", "env_classes"):
        input_batch[key] = input_batch[key] * 2
    input_batch["env_extras"] = [{"task": task.name}] * 2 + [{"task": "broken"}, {"task": task.name}]
    generator, output = generate([task, broken], tokenizer, input_batch)
    validate_generator_output(4, output, step_wise=True)
    groups = [tid.instance_id for tid in output["trajectory_ids"]]
    masks = {g: [any(m) for m, g2 in zip(output["loss_masks"], groups, strict=True) if g2 == g] for g in ("a", "b")}
    assert all(masks["a"]) and not any(masks["b"])  # b's healthy sibling is masked with it
    assert generator.last_trajectories[2].error and generator.last_trajectories[3].reward in (0.0, 1.0)

    _, graded = generate([task, broken], tokenizer, input_batch, masking=MaskingPolicy())
    rows = zip(graded["loss_masks"], graded["trajectory_ids"], strict=True)
    b_rows = [any(m) for m, tid in rows if tid.instance_id == "b"]
    assert b_rows[0] is False and all(b_rows[1:])  # per-row masking: only the rollout that never ran


def test_the_registered_text_env_plays_an_episode_from_a_thread_pool(task):
    register()
    register()  # a second registration is harmless
    env = skyrl_gym.make(ENV_ID, env_config={"mode": "train"}, extras={"task": str(task.path)})
    assert isinstance(env, TerminusTextEnv)

    async def main():
        loop = asyncio.get_running_loop()
        messages, _ = env.init([{"role": "user", "content": task.name}])
        assert task.instruction.strip() in messages[0]["content"]
        steps = []
        for turn in range(3):
            # SkyRL's generator steps envs in an executor thread; the sync env runs on the shared loop.
            out = await loop.run_in_executor(None, env.step, oracle_reply(task, turn))
            steps.append(out)
            if out["done"]:
                break
        return steps

    try:
        steps = asyncio.run(main())
    finally:
        env.close()
    assert [s["done"] for s in steps] == [False, False, True]
    assert steps[-1]["reward"] == 1.0 and steps[-1]["metadata"]["end_reason"] == "task_complete"
    assert steps[0]["observations"][0]["role"] == "user" and steps[-1]["observations"] == []
    assert env.get_metrics()["format_errors"] == 0


def test_a_turn_cut_at_max_tokens_ends_turn_truncated_in_train_mode(task, tokenizer):
    """The engine's finish_reason reaches the env through the generator: a reply cut at max_tokens after a complete,
    task-completing <response> ends the strict episode turn_truncated, reward 0. (The skyrl_gym text env sees text
    only: SkyRL's own generator does not pass the finish reason to ``step``.)"""

    def rambles(messages):
        turn = sum(m["role"] == "assistant" for m in messages)
        return oracle_reply(task, turn) + (" and so on" * 300 if turn == 1 else "")

    budget = len(tokenizer.encode(oracle_reply(task, 0))) + 50
    generator, output = generate([task], tokenizer, batch(task, ["a"], group=1), replies=rambles, max_tokens=budget)
    (trajectory,) = generator.last_trajectories
    assert [t.finish_reason for t in trajectory.turns] == ["stop", "length"]
    assert trajectory.summary.end_reason == "turn_truncated" and output["rewards"][-1][-1] == 0.0
