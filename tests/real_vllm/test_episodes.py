"""Shipped tasks played by the random model on real vLLM: strict and lenient endings, and token-exact training rows.

The model's words are noise. Its sampling is limited to whole words (tokens that are one word with its leading
space) and the end-of-turn token, made likely, so replies end with ``stop`` and re-tokenize to the same ids: the
canonical ChatML template then reproduces every turn, and drift must be 0.
"""

from __future__ import annotations

import asyncio

import pytest
from vllm_support import MODEL_NAME

from terminus_env.rollout import RolloutRunner, ServingPolicy
from terminus_env.rules import EndReason
from terminus_env.serving import ServingPool
from terminus_env.tasks import find_task
from terminus_env.training import DriftPolicy, drift_counts, merged_sequences

pytestmark = pytest.mark.usefixtures("docker_required")
TASKS = ("hello-world", "csv-to-json")


def word_sampling(tokenizer) -> dict:
    """Sampling over whole-word tokens and ``<|im_end|>`` (biased up, so replies end by themselves)."""
    words = [i for token, i in tokenizer.get_vocab().items()
             if token.startswith("Ġ") and token[1:].isalpha() and len(token) > 3
             and tokenizer.encode(" " + token[1:], add_special_tokens=False) == [i]]  # fmt: skip
    assert len(words) >= 20, words
    eos = tokenizer.eos_token_id
    return {"allowed_token_ids": sorted(words)[:64] + [eos], "logit_bias": {str(eos): 4.0}, "temperature": 1.0}


def play(fleet, tokenizer, mode: str):
    async def main():
        async with ServingPool(fleet.urls, MODEL_NAME) as pool:
            policy = ServingPolicy(pool, max_tokens=64, sampling=word_sampling(tokenizer))
            runner = RolloutRunner(policy, env_kwargs={"mode": mode, "max_turns": 3}, max_sandboxes=2)
            return await runner.run([find_task(name) for name in TASKS])

    return asyncio.run(main())


@pytest.fixture(scope="module")
def lenient(fleet, tokenizer):
    return play(fleet, tokenizer, "eval")


def test_strict_runs_of_noise_end_format_error_after_one_turn(fleet, tokenizer):
    for t in play(fleet, tokenizer, "train"):
        assert t.error is None and t.summary is not None, t.error
        assert t.summary.end_reason is EndReason.FORMAT_ERROR and t.reward == 0.0 and not t.summary.graded
        assert len(t.turns) == 1 and t.turns[0].finish_reason == "stop"


def test_lenient_runs_of_noise_feed_the_error_back_until_the_turn_limit(lenient):
    for t in lenient:
        assert t.summary.end_reason is EndReason.MAX_TURNS and len(t.turns) == 3
        assert t.summary.format_errors == 3 and all(turn.format_error for turn in t.turns)
        feedback = [m["content"] for m in t.messages if m["role"] == "user"][1:]
        assert len(feedback) == 2 and all("parsing errors" in text for text in feedback)


def test_merged_rows_from_real_token_ids_are_what_the_engine_produced(lenient):
    sequences = merged_sequences(lenient, DriftPolicy.RAISE)  # raises on any drift
    assert drift_counts(sequences).drifted_turns == 0 and len(sequences) == len(lenient)
    for t, s in zip(lenient, sequences):
        last = t.turns[-1]
        # The whole sequence is the last prompt the engine saw and what it generated.
        assert s.prompt_ids + s.response_ids == last.prompt_token_ids + last.token_ids
        assert s.prompt_ids == t.turns[0].prompt_token_ids
        trained = [tok for tok, m in zip(s.response_ids, s.response_mask) if m]
        assert trained == [tok for turn in t.turns for tok in turn.token_ids]
        assert [lp for lp, m in zip(s.response_logprobs, s.response_mask) if m] == [
            lp for turn in t.turns for lp in turn.logprobs
        ]
