"""verl: TerminusAgentLoop loaded the way verl's workers load it, its AgentLoopOutput through verl's own
post-processing, and our merged builder against verl's Continuous Token builder, token for token.

Real Docker episodes; a ChatML tokenizer built here. Needs ``pip install 'terminus-env[verl]'``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

import hydra
import pytest
from adapter_support import HalfRight, oracle_server
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopOutput,
    AgentLoopWorker,
    DictConfigWrap,
    ToolListWrap,
    _agent_loop_registry,
)
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.utils.tokenizer.continuous_token import ContinuousTokenBuilder, QwenContinuousTokenBuilder
from verl.workers.rollout.replica import TokenOutput

from terminus_env.integrations import verl as terminus_verl
from terminus_env.rollout import RolloutRunner, ServingPolicy
from terminus_env.rollout.policy import oracle_reply
from terminus_env.serving import ServingPool
from terminus_env.training import merged_sequences

pytestmark = pytest.mark.usefixtures("docker_required")

PROMPT_LENGTH, RESPONSE_LENGTH = 2048, 4096


def trainer_config():
    return OmegaConf.create(
        {
            "actor_rollout_ref": {"rollout": {"prompt_length": PROMPT_LENGTH, "response_length": RESPONSE_LENGTH}},
            "data": {"apply_chat_template_kwargs": {}},
        }
    )


class OracleServerManager:
    """Stands in for verl's LLMServerClient (a vLLM server behind it): token ids in, verl's TokenOutput out.

    The 'model' types the task's solution; its tokens are the tokenizer's, ending with <|im_end|>.
    """

    def __init__(self, task, tokenizer, tail: str = "") -> None:
        self.task, self.tokenizer, self.tail = task, tokenizer, tail  # tail: words added after the second reply
        self.calls: list[dict] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        turn = self.tokenizer.decode(prompt_ids).count("<|im_start|>assistant") - 1
        reply = oracle_reply(self.task, turn) + (self.tail if turn == 1 else "")
        ids = self.tokenizer.encode(reply, add_special_tokens=False)
        ids = (ids + [self.tokenizer.eos_token_id])[: sampling_params["max_tokens"]]
        self.calls.append({"prompt_ids": list(prompt_ids), "token_ids": ids, "sampling": sampling_params})
        return TokenOutput(token_ids=ids, log_probs=[-0.25] * len(ids), stop_reason="completed")


def load_from_yaml(tmp_path, task, tokenizer, manager, hf_model_type="qwen2", extra_yaml=""):
    """What verl's AgentLoopWorker does: read agent_loop_config_path, then hydra-instantiate the named loop.

    Call it on the event loop that will run the agent loop, as verl's worker does (the loop keeps it).
    """
    yaml = tmp_path / "agent_loops.yaml"
    yaml.write_text(
        "- name: terminus\n"
        "  _target_: terminus_env.integrations.verl.TerminusAgentLoop\n"
        f"  tasks_dir: {task.path.parent}\n"
        "  mode: train\n"
        "  max_turns: 5\n" + extra_yaml
    )
    for entry in OmegaConf.load(yaml):
        _agent_loop_registry[entry.name] = entry
    config = trainer_config()
    return hydra.utils.instantiate(
        config=_agent_loop_registry["terminus"],
        trainer_config=DictConfigWrap(config=config),
        server_manager=manager,
        tokenizer=tokenizer,
        processor=None,
        hf_model_type=hf_model_type,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(config.data),
        tools=ToolListWrap([]),
    )


def postprocess(tokenizer, output: AgentLoopOutput, raw_prompt):
    """verl's own per-sample post-processing (padding, masks, positions) on our output."""
    worker = AgentLoopWorker.__new__(AgentLoopWorker)  # a worker without its Ray actor and servers
    worker.rollout_config = trainer_config().actor_rollout_ref.rollout
    worker.tokenizer, worker.processor = tokenizer, None
    worker.mm_processor_kwargs, worker.reward_loop_worker_handles, worker.distillation_enabled = {}, None, False
    return asyncio.run(worker._agent_loop_postprocess(output, validate=False, raw_prompt=raw_prompt))


def test_the_registered_loop_runs_an_episode_into_verls_types(task, tokenizer, tmp_path):
    assert _agent_loop_registry["terminus"]["_target_"] == "terminus_env.integrations.verl.TerminusAgentLoop"
    manager = OracleServerManager(task, tokenizer)
    raw_prompt = [{"role": "user", "content": task.instruction}]

    async def main():
        loop = load_from_yaml(tmp_path, task, tokenizer, manager)
        assert isinstance(loop, terminus_verl.TerminusAgentLoop)
        assert isinstance(loop.continuous_token_builder, QwenContinuousTokenBuilder)
        return await loop.run({"temperature": 1.0}, raw_prompt=raw_prompt, extra_info={"task": task.name})

    output = asyncio.run(main())

    assert isinstance(output, AgentLoopOutput) and output.reward_score == 1.0
    assert output.extra_fields["end_reason"] == "task_complete" and output.extra_fields["masked"] is None
    assert len(output.response_ids) == len(output.response_mask) == len(output.response_logprobs)
    # The stream is exactly the last prompt verl's server saw, then the last completion.
    first, last = manager.calls[0], manager.calls[-1]
    assert output.prompt_ids == first["prompt_ids"]
    assert output.prompt_ids + output.response_ids == last["prompt_ids"] + last["token_ids"]
    assert sum(output.response_mask) == sum(len(call["token_ids"]) for call in manager.calls)
    trained = [lp for lp, m in zip(output.response_logprobs, output.response_mask, strict=True) if m]
    assert trained and all(lp == -0.25 for lp in trained)
    assert all(lp == 0.0 for lp, m in zip(output.response_logprobs, output.response_mask, strict=True) if not m)
    assert all(call["sampling"]["temperature"] == 1.0 and call["sampling"]["max_tokens"] > 0 for call in manager.calls)

    internal = postprocess(tokenizer, output, raw_prompt)
    assert internal.input_ids.shape == (1, PROMPT_LENGTH + RESPONSE_LENGTH)
    assert int(internal.response_mask.sum()) == sum(output.response_mask)
    assert int(internal.attention_mask.sum()) == len(output.prompt_ids) + len(output.response_ids)
    as_dict = output.as_dict()
    assert float(as_dict["rm_scores"][-1]) == 1.0 and as_dict["responses"].tolist() == output.response_ids


def test_a_rollout_whose_task_cannot_start_returns_a_masked_sample_instead_of_raising(task, tokenizer, tmp_path):
    missing = "terminus-env/does-not-exist:never"
    broken = dataclasses.replace(task, docker_image=missing, build_context=None)
    raw_prompt = [{"role": "user", "content": task.instruction}]

    async def main():
        loop = load_from_yaml(tmp_path, task, tokenizer, OracleServerManager(task, tokenizer))
        loop.tasks = terminus_verl.TaskLookup([broken])
        return await loop.run({}, raw_prompt=raw_prompt, extra_info={"task": task.name})

    output = asyncio.run(main())
    assert output.reward_score == 0.0 and sum(output.response_mask) == 0
    assert output.extra_fields["end_reason"] == "no_episode" and output.extra_fields["error"]
    postprocess(tokenizer, output, raw_prompt)  # verl's post-processing takes it as it is


def test_merged_sequence_equals_verls_continuous_token_stream_for_a_chatml_conversation(task, tokenizer):
    """A conversation served through the chat API (each prompt the whole chat re-rendered by the template),
    merged from the engine's token ids, against verl's Qwen builder fed the same messages and completions."""

    async def episodes():
        async with contextlib.AsyncExitStack() as stack:
            server = await stack.enter_async_context(oracle_server([task], tokenizer, HalfRight([task])))
            pool = await stack.enter_async_context(ServingPool([server.url], "sim"))
            runner = RolloutRunner(ServingPolicy(pool, max_tokens=2048), env_kwargs={"mode": "train"})
            return await runner.run([task], group_size=2)

    trajectories = asyncio.run(episodes())
    assert sorted(t.reward for t in trajectories) == [0.0, 1.0]
    for trajectory, sequence in zip(trajectories, merged_sequences(trajectories), strict=True):
        ids, mask, logprobs = verl_stream(QwenContinuousTokenBuilder(tokenizer), trajectory)
        assert sequence.prompt_ids + sequence.response_ids == ids
        assert sequence.response_mask == mask and sequence.response_logprobs == logprobs
        assert sequence.drifted_turns == 0
        # verl's default builder omits the newline the template puts after <|im_end|>: not the template's stream.
        naive, _, _ = verl_stream(ContinuousTokenBuilder(tokenizer), trajectory)
        assert naive != ids and len(ids) - len(naive) == len(trajectory.turns) - 1


def verl_stream(builder, trajectory):
    """The token stream verl's agent loop keeps for this conversation, with its response mask and logprobs."""
    messages = trajectory.messages
    first = trajectory.turns[0]
    ids = builder.build_initial_tokens(messages[:1])
    assert ids == first.prompt_token_ids
    prompt_length = len(ids)
    mask: list[int] = []
    logprobs: list[float] = []
    for k, turn in enumerate(trajectory.turns):
        if k:
            previous, updated = messages[: 2 * k], messages[: 2 * k + 1]
            merge = builder.merge_context_tokens(previous, updated, ids)
            mask, logprobs = builder.align_response_metadata(merge, mask, logprobs)
            ids = merge.token_ids
        merge = builder.merge_assistant_tokens(ids, turn.token_ids)
        mask, logprobs = builder.align_response_metadata(merge, mask, logprobs, assistant_logprobs=turn.logprobs)
        ids = merge.token_ids
    assert len(ids) - prompt_length == len(mask)
    return ids, mask, logprobs


def test_a_turn_cut_at_max_tokens_ends_turn_truncated_in_train_mode(task, tokenizer, tmp_path):
    """A reply cut at the turn's token budget after a complete, task-completing <response> is a truncated turn."""
    manager = OracleServerManager(task, tokenizer, tail=" and so on" * 300)
    budget = len(tokenizer.encode(oracle_reply(task, 0), add_special_tokens=False)) + 50

    async def main():
        loop = load_from_yaml(tmp_path, task, tokenizer, manager, extra_yaml=f"  max_turn_tokens: {budget}\n")
        raw_prompt = [{"role": "user", "content": task.instruction}]
        return await loop.run({}, raw_prompt=raw_prompt, extra_info={"task": task.name})

    output = asyncio.run(main())
    assert [len(call["token_ids"]) for call in manager.calls][1] == budget  # the second reply was cut
    assert output.extra_fields["end_reason"] == "turn_truncated" and output.reward_score == 0.0
