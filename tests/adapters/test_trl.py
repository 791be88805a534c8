"""TRL: our rollout_func through GRPOTrainer's own code path, and one real optimizer step on CPU.

Real Docker episodes; replies from the simulated vLLM replica, tokenized by a ChatML tokenizer built
here; a tiny randomly initialised Qwen2 model. Needs ``pip install 'terminus-env[trl]'``.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from adapter_support import HalfRight, oracle_server
from datasets import Dataset
from transformers import Qwen2Config, Qwen2ForCausalLM
from trl import GRPOConfig, GRPOTrainer

from terminus_env.integrations.trl import REWARD_FIELD, env_reward, make_rollout_func
from terminus_env.records.step_log import read_step_log
from terminus_env.rollout.policy import oracle_reply
from terminus_env.utils.bridge import shared_loop

pytestmark = pytest.mark.usefixtures("docker_required")


@pytest.fixture(scope="module")
def server(task, tokenizer):
    server = oracle_server([task], tokenizer, HalfRight([task]))
    shared_loop().run(server.start())  # on the loop where the rollout func's serving pool lives
    yield server
    shared_loop().run(server.aclose())


def tiny_model(tokenizer) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=8192,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config)


def test_one_grpo_optimizer_step_on_cpu_on_our_rollouts(task, tokenizer, server, tmp_path):
    seen_prompts: list[list] = []
    step_log = tmp_path / "steps.jsonl"
    rollouts = make_rollout_func([task], base_urls=[server.url], model="sim", max_tokens=2048, step_log=step_log)

    def rollout_func(prompts, trainer):
        seen_prompts.append(list(prompts))
        return rollouts(prompts, trainer)

    rewards_seen: list[list] = []

    def reward(completions, **kwargs):
        rewards_seen.append(list(kwargs[REWARD_FIELD]))
        return env_reward(completions, **kwargs)

    model = tiny_model(tokenizer)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=2,
        num_generations=2,
        max_steps=1,
        learning_rate=1e-2,
        use_cpu=True,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        bf16=False,
        beta=0.0,
        max_completion_length=4096,
    )
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": task.name}]] * 4})
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        rollout_func=rollout_func,
    )
    try:
        trainer.train()
    finally:
        rollouts.close()

    # TRL 1.16 hands rollout_func each prompt num_generations times in a row; one run is one GRPO group.
    assert len(seen_prompts) == 1 and len(seen_prompts[0]) == 2 and seen_prompts[0][0] == seen_prompts[0][1]
    trajectories = rollouts.last_trajectories
    assert sorted(t.reward for t in trajectories) == [0.0, 1.0] and len({t.group_id for t in trajectories}) == 1
    assert rewards_seen == [[t.reward for t in trajectories]]
    # Token-exact: TRL received the engine's ids, which decode back to the conversation.
    first = trajectories[0].turns[-1]
    assert tokenizer.decode(first.token_ids, skip_special_tokens=True) == first.reply
    assert all(turn.policy_version == 0 for t in trajectories for turn in t.turns)  # trainer.state.global_step
    after = dict(model.named_parameters())
    changed = [name for name, p in after.items() if not torch.equal(p.detach(), before[name])]
    assert changed, "the optimizer step changed no weight"
    logged = trainer.state.log_history[0]
    assert logged["reward"] == 0.5 and logged["env/mean_reward"] == 0.5 and logged["env/drifted_turns"] == 0.0
    assert logged["loss"] != 0.0 and logged["grad_norm"] > 0.0
    # The step log: the batch as the optimizer step it trained, for terminus-env view's training-run page.
    (step,) = read_step_log(step_log)
    assert step.step == 1 and step.episodes == 2 and step.mean_reward == logged["env/mean_reward"] == 0.5
    assert step.end_reasons == dict(Counter(str(t.summary.end_reason) for t in trajectories))
    assert step.masked == 0 and step.extra["rollout_s"] > 0


def test_rollout_func_output_passes_trls_checks_and_masks_with_none(task, tokenizer, server):
    class Trainer:  # what rollout_func reads of the trainer: its step and its tokenizer
        class state:
            global_step = 3

        processing_class = tokenizer

    with make_rollout_func([task], base_urls=[server.url], model="sim", max_tokens=2048) as rollouts:
        out = rollouts([task.instruction, task.instruction], Trainer())
    assert {"prompt_ids", "completion_ids", "logprobs"} <= out.keys()  # what GRPOTrainer._generate requires
    for ids, mask, logprobs in zip(out["completion_ids"], out["env_mask"], out["logprobs"], strict=True):
        assert len(ids) == len(mask) == len(logprobs) and 0 < sum(mask) < len(mask)
        assert all(lp == 0.0 for lp, m in zip(logprobs, mask, strict=True) if m == 0)
    assert sorted(out[REWARD_FIELD]) == [0.0, 1.0]
    for i, trajectory in enumerate(rollouts.last_trajectories):
        text = tokenizer.decode(out["prompt_ids"][i] + out["completion_ids"][i])
        # Between turns, the template's newline after <|im_end|>, taken from the engine's next prompt.
        assert text.count("<|im_end|>\n<|im_start|>user") == len(trajectory.turns) - 1 > 0
        assert all(turn.policy_version == 3 for turn in trajectory.turns)


def test_a_turn_cut_at_max_tokens_ends_turn_truncated_and_the_batch_says_so(task, tokenizer):
    """The engine's finish_reason reaches the env through the rollout function: a reply cut at max_tokens after a
    complete, task-completing <response> ends the strict episode turn_truncated; the batch's end_reason is the env's
    and its finish_reason the engine's."""

    def rambles(messages):
        turn = sum(m["role"] == "assistant" for m in messages)
        return oracle_reply(task, turn) + (" and so on" * 300 if turn == 1 else "")

    class Trainer:
        class state:
            global_step = 0

        processing_class = tokenizer

    server = oracle_server([task], tokenizer, rambles)
    shared_loop().run(server.start())
    try:
        budget = len(tokenizer.encode(oracle_reply(task, 0))) + 50
        with make_rollout_func([task], base_urls=[server.url], model="sim", max_tokens=budget) as rollouts:
            out = rollouts([task.instruction], Trainer())
    finally:
        shared_loop().run(server.aclose())
    (trajectory,) = rollouts.last_trajectories
    assert [t.finish_reason for t in trajectory.turns] == ["stop", "length"]
    assert trajectory.summary.end_reason == "turn_truncated" and trajectory.reward == 0.0
    assert out["end_reason"] == ["turn_truncated"] and out["finish_reason"] == ["length"]


def test_ids_outside_the_trainers_vocabulary_are_refused_with_the_cause(task, tokenizer):
    """The simulated server's toy tokenizer (ids up to about 151,000) against a 1,024-token model: a clear error
    naming the tokenizer mismatch and --tokenizer, not an IndexError in embed_tokens."""
    from terminus_env.rollout.policy import OracleReplies
    from terminus_env.serving.sim.server import ServerConfig, SimServer
    from terminus_env.training import TrainingDataError

    class Trainer:
        class state:
            global_step = 0

        processing_class = tokenizer
        model = tiny_model(tokenizer)

    server = SimServer(ServerConfig(model="sim", time_scale=0.0), OracleReplies([task]))  # the toy tokenizer
    shared_loop().run(server.start())
    try:
        with make_rollout_func([task], base_urls=[server.url], model="sim", max_tokens=2048) as rollouts:
            with pytest.raises(TrainingDataError, match=r"outside the model.s vocabulary of \d+.*--tokenizer"):
                rollouts([task.instruction], Trainer())
    finally:
        shared_loop().run(server.aclose())


def test_lenient_a_turn_cut_at_max_tokens_is_told_the_limit_it_was_cut_at(task, tokenizer):
    """One limit for the engine and the env: a reply cut at max_tokens=48 is fed back as over 48 tokens, not over the
    env's default of 16,384; a different max_turn_tokens beside max_tokens is refused."""

    def rambles(messages):
        return "<response><analysis>" + " and so on" * 300

    class Trainer:
        class state:
            global_step = 0

        processing_class = tokenizer

    with pytest.raises(ValueError, match="max_turn_tokens=100 differs from max_tokens=48"):
        make_rollout_func([task], base_urls=["http://127.0.0.1:9"], model="sim", max_tokens=48,
                          env_kwargs={"max_turn_tokens": 100})  # fmt: skip
    server = oracle_server([task], tokenizer, rambles)
    shared_loop().run(server.start())
    try:
        with make_rollout_func([task], base_urls=[server.url], model="sim", max_tokens=48,
                               env_kwargs={"mode": "eval", "max_turns": 2}) as rollouts:  # fmt: skip
            rollouts([task.instruction], Trainer())
    finally:
        shared_loop().run(server.aclose())
    (trajectory,) = rollouts.last_trajectories
    assert trajectory.turns[0].finish_reason == "length" and len(trajectory.turns[0].token_ids) == 48
    feedback = [m["content"] for m in trajectory.messages if m["role"] == "user"][1]
    assert "went over the limit of 48 tokens" in feedback


def test_trl_uses_the_engines_logprobs_in_its_off_policy_mask_when_given_a_threshold(task, tokenizer, server, tmp_path):
    """With our replicas TRL runs with use_vllm=False, where the rollout's logprobs reach the loss only through the
    off-policy sequence mask: with off_policy_mask_threshold set, TRL computes it from the engine's logprobs of the
    model's own tokens (the env's tokens between turns masked out); without it, it never looks at them."""
    seen: list[tuple] = []

    class Recording(GRPOTrainer):
        @staticmethod
        def get_off_policy_mask(advantages, per_token_logps, sampling_per_token_logps, mask, off_policy_threshold):
            seen.append((sampling_per_token_logps.detach().clone(), mask.detach().clone()))
            return GRPOTrainer.get_off_policy_mask(
                advantages, per_token_logps, sampling_per_token_logps, mask, off_policy_threshold
            )

    def train(threshold):
        rollouts = make_rollout_func([task], base_urls=[server.url], model="sim", max_tokens=2048)
        batches: list[dict] = []

        def rollout_func(prompts, trainer):
            batches.append(rollouts(prompts, trainer))
            return batches[-1]

        args = GRPOConfig(output_dir=str(tmp_path / f"out-{threshold}"), per_device_train_batch_size=2,
                          num_generations=2, max_steps=1, learning_rate=1e-2, use_cpu=True, report_to=[],
                          save_strategy="no", bf16=False, beta=0.0, max_completion_length=4096,
                          off_policy_mask_threshold=threshold)  # fmt: skip
        dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": task.name}]] * 2})
        trainer = Recording(model=tiny_model(tokenizer), reward_funcs=[env_reward], args=args, train_dataset=dataset,
                            processing_class=tokenizer, rollout_func=rollout_func)  # fmt: skip
        try:
            trainer.train()
        finally:
            rollouts.close()
        return batches[0]

    train(None)
    assert seen == []  # no threshold: the engine's logprobs are never read
    batch = train(0.5)
    assert len(seen) == 1
    sampling, mask = seen[0]

    def trained(logprobs, row_mask) -> tuple:
        """Where a row trains and the logprobs there."""
        at = [i for i, m in enumerate(row_mask) if int(m)]
        return tuple(at), tuple(round(float(logprobs[i]), 4) for i in at)

    ours = sorted(trained(lps, m) for lps, m in zip(batch["logprobs"], batch["env_mask"]))
    theirs = sorted(trained(row, row_mask) for row, row_mask in zip(sampling, mask))
    assert theirs == ours  # TRL's mask is our env_mask, its sampling logprobs the engine's
    assert all(at and any(lp != 0.0 for lp in lps) for at, lps in ours)
