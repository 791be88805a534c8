"""Training data from trajectories: step-wise rows, merged sequences, drift and masking (no RL library needed).

The conversations are rendered by a small ChatML tokenizer written here: ``<|im_end|>`` is followed
by a newline the model never generates, as in Qwen's template, and the per-turn prompts are full
re-renders of the chat, as vLLM's chat endpoint makes them.
"""

from __future__ import annotations

import re

import pytest

from terminus_env.env import EpisodeSummary
from terminus_env.records.metrics import aggregate
from terminus_env.rollout.trajectory import Trajectory, TurnRecord
from terminus_env.training import (
    DriftPolicy,
    MaskingPolicy,
    MaskScope,
    TimeLimitEnds,
    TokenDriftError,
    TrainingDataError,
    check_vocabulary,
    drift_counts,
    group_indices,
    mask_reasons,
    merge_trajectory,
    merged_sequences,
    step_rows,
    untrained_token_share,
)


class ChatML:
    """Word-level ChatML: one id per special token, per newline, and per word (with its leading space)."""

    SPECIAL = ("<|im_start|>", "<|im_end|>", "\n")

    def __init__(self, drop_think: bool = False) -> None:
        self.vocab: dict[str, int] = {s: i for i, s in enumerate(self.SPECIAL)}
        self.drop_think = drop_think  # rewrite history as Qwen3's template does: earlier <think> blocks vanish

    @property
    def im_end(self) -> int:
        return self.vocab["<|im_end|>"]

    def encode(self, text: str) -> list[int]:
        pieces = re.findall(r"<\|im_start\|>|<\|im_end\|>|\n| ?[^ \n<]+| ?<[^ \n<]*| +", text)
        assert "".join(pieces) == text
        return [self.vocab.setdefault(p, len(self.vocab)) for p in pieces]

    def render(self, messages: list[dict], generation_prompt: bool = True) -> list[int]:
        text = ""
        for message in messages:
            content = message["content"]
            if self.drop_think and message["role"] == "assistant":
                content = re.sub(r"<think>.*?</think>", "", content)
            text += f"<|im_start|>{message['role']}\n{content}<|im_end|>\n"
        if generation_prompt:
            text += "<|im_start|>assistant\n"
        return self.encode(text)


def summary(reward: float = 1.0, end_reason: str = "task_complete", turns: int = 2, **kw) -> EpisodeSummary:
    fields = dict(
        task="t",
        reward=reward,
        end_reason=end_reason,
        turns=turns,
        format_errors=0,
        format_error_opening_streak=0,
        warnings=0,
        truncated_turns=0,
        graded=end_reason in ("task_complete", "agent_timeout", "max_turns"),
        masked=end_reason == "env_error",
        rescued=False,
    )
    fields.update(kw)
    return EpisodeSummary(**fields)


def served(
    tok: ChatML,
    replies: list[str],
    observations: list[str],
    *,
    sampled: dict[int, list[int]] | None = None,
    rollout: str = "r0",
    group: str = "g0",
    end: EpisodeSummary | None = None,
) -> Trajectory:
    """A trajectory as a chat server produces it: each turn's prompt is the whole chat re-rendered.

    ``sampled[k]`` replaces turn k's generated ids (before the end-of-turn token): a tokenization
    of the same text that the tokenizer would not produce itself.
    """
    messages = [{"role": "user", "content": observations[0]}]
    turns = []
    for k, reply in enumerate(replies):
        prompt = tok.render(messages)
        ids = (sampled or {}).get(k, tok.encode(reply)) + [tok.im_end]
        turns.append(
            TurnRecord(
                reply=reply,
                finish_reason="stop",
                prompt_token_ids=prompt,
                token_ids=ids,
                logprobs=[-0.5 - 0.01 * i for i in range(len(ids))],
                policy_version=k,
                sampling={"temperature": 1.0},
            )
        )
        messages.append({"role": "assistant", "content": reply})
        if k + 1 < len(observations):
            messages.append({"role": "user", "content": observations[k + 1]})
    return Trajectory(rollout, "t", group, messages=messages, turns=turns, summary=end or summary(turns=len(turns)))


REPLIES = ["<think>ls first</think> run ls", "<think>done now</think> all done"]
OBSERVATIONS = ["Write hello into /app/hello.txt", "New terminal output: a b c"]


def test_merged_sequence_is_first_prompt_then_completions_and_env_tokens_between():
    tok = ChatML()
    trajectory = served(tok, REPLIES, OBSERVATIONS)
    (sequence,) = merged_sequences([trajectory])
    first, second = trajectory.turns
    assert sequence.prompt_ids == first.prompt_token_ids
    # The whole stream is exactly the last prompt the engine saw, then its completion.
    assert sequence.prompt_ids + sequence.response_ids == second.prompt_token_ids + second.token_ids
    n1 = len(first.token_ids)
    between = second.prompt_token_ids[len(first.prompt_token_ids) + n1 :]
    assert between[0] == tok.vocab["\n"]  # the template's newline after <|im_end|>: context, not trained
    assert sequence.response_mask == [1] * n1 + [0] * len(between) + [1] * len(second.token_ids)
    assert sequence.response_logprobs == first.logprobs + [0.0] * len(between) + second.logprobs
    assert (sequence.drifted_turns, sequence.realigned_tokens, sequence.masked) == (0, 0, False)
    assert sequence.reward == 1.0 and sequence.turns == 2 and sequence.policy_versions == (0, 1)


def test_a_naive_concatenation_differs_from_the_template_by_the_newline():
    tok = ChatML()
    trajectory = served(tok, REPLIES, OBSERVATIONS)
    (sequence,) = merged_sequences([trajectory])
    first = trajectory.turns[0]
    naive = first.prompt_token_ids + first.token_ids + tok.render([{"role": "user", "content": OBSERVATIONS[1]}])
    assert sequence.prompt_ids + sequence.response_ids[: len(naive) - len(first.prompt_token_ids)] != naive


def test_step_rows_carry_each_prompt_and_the_reward_on_the_last_step():
    tok = ChatML()
    trajectory = served(tok, REPLIES, OBSERVATIONS, end=summary(reward=0.5))
    rows = step_rows([trajectory])
    assert [r.turn for r in rows] == [0, 1] and [r.is_last_step for r in rows] == [False, True]
    assert [r.reward for r in rows] == [0.0, 0.5]
    for row, turn in zip(rows, trajectory.turns, strict=True):
        assert row.prompt_ids == turn.prompt_token_ids and row.response_ids == turn.token_ids
        assert row.loss_mask == [1] * len(turn.token_ids) and row.logprobs == turn.logprobs
        assert row.sampling == {"temperature": 1.0} and row.stop_reason == "stop"
    assert [r.policy_version for r in rows] == [0, 1]


def test_a_non_canonical_sampled_tokenization_is_drift_under_every_policy():
    tok = ChatML()
    # The model spelled " run" as " r" + "un"; re-rendering the history tokenizes it as " run".
    odd = tok.encode("<think>ls first</think> r") + tok.encode("un ls")
    trajectory = served(tok, REPLIES, OBSERVATIONS, sampled={0: odd})
    first, second = trajectory.turns
    assert first.token_ids[:-1] != tok.encode(REPLIES[0])

    with pytest.raises(TokenDriftError, match="turn 1"):
        merge_trajectory(trajectory, DriftPolicy.RAISE)

    split = merge_trajectory(trajectory, DriftPolicy.SPLIT)
    assert len(split) == 2 and [s.segment for s in split] == [0, 1] and [s.last_segment for s in split] == [False, True]
    assert split[0].prompt_ids == first.prompt_token_ids and split[0].response_ids == first.token_ids
    assert split[1].prompt_ids == second.prompt_token_ids and split[1].response_ids == second.token_ids
    assert sum(s.drifted_turns for s in split) == 1

    (realigned,) = merge_trajectory(trajectory, DriftPolicy.REALIGN)
    # One sequence; its tokens are what the engine saw at the last turn, then that turn's completion.
    assert realigned.prompt_ids + realigned.response_ids == second.prompt_token_ids + second.token_ids
    assert realigned.drifted_turns == 1 and realigned.realigned_tokens > 0
    trained = [t for t, m in zip(realigned.response_ids, realigned.response_mask, strict=True) if m]
    # Only tokens sampled under exactly this prefix train: the first turn's tokens up to the divergence,
    # and the whole last completion. The mismatched tokens became context.
    diverge = next(i for i, (a, b) in enumerate(zip(odd, tok.encode(REPLIES[0]), strict=False)) if a != b)
    assert trained == odd[:diverge] + second.token_ids
    assert drift_counts([realigned]).drifted_turns == 1
    # What REALIGN stopped training, as the trainer's log shows it: the first completion past the divergence.
    generated = len(first.token_ids) + len(second.token_ids)
    assert untrained_token_share([trajectory], [realigned]) == (len(first.token_ids) - diverge) / generated > 0
    assert untrained_token_share([trajectory], split) == 0.0  # SPLIT trains every completion


def test_sequences_carry_the_envs_end_reason_and_ids_outside_the_vocabulary_are_refused():
    tok = ChatML()
    trajectory = served(tok, REPLIES, OBSERVATIONS, end=summary(0.0, "format_error"))
    (sequence,) = merge_trajectory(trajectory, DriftPolicy.RAISE)
    assert sequence.end_reason == "format_error" and sequence.stop_reason == "stop"
    top = max(sequence.prompt_ids + sequence.response_ids)
    check_vocabulary([sequence], top + 1)
    with pytest.raises(TrainingDataError, match=f"token id {top} is outside the model's vocabulary of {top}"):
        check_vocabulary([sequence], top)


def test_a_template_that_rewrites_history_drifts_and_realigns_inside_the_response():
    tok = ChatML(drop_think=True)
    trajectory = served(tok, REPLIES, OBSERVATIONS)
    (sequence,) = merge_trajectory(trajectory, DriftPolicy.REALIGN)
    second = trajectory.turns[1]
    assert sequence.drifted_turns == 1
    assert sequence.prompt_ids + sequence.response_ids == second.prompt_token_ids + second.token_ids
    assert sequence.response_mask[-len(second.token_ids) :] == [1] * len(second.token_ids)


def test_drift_is_counted_in_the_batch_metrics():
    tok = ChatML(drop_think=True)
    trajectories = [served(tok, REPLIES, OBSERVATIONS, rollout=f"r{i}") for i in range(3)]
    sequences = merged_sequences(trajectories, DriftPolicy.SPLIT)
    counts = drift_counts(sequences)
    assert (counts.drifted_turns, counts.drifted_rollouts) == (3, 3)
    metrics = aggregate(trajectories, drift=counts)
    assert metrics.drifted_turns == 3 and metrics.drifted_rollouts == 3 and metrics.episodes == 3
    assert aggregate(trajectories).drifted_turns == 0


def test_masking_env_errors_always_and_time_limits_by_choice_per_row_or_group():
    tok = ChatML()
    trajectories = [
        served(tok, REPLIES, OBSERVATIONS, rollout="a0", group="a"),
        served(tok, REPLIES, OBSERVATIONS, rollout="a1", group="a", end=summary(0.0, "env_error")),
        served(tok, REPLIES, OBSERVATIONS, rollout="b0", group="b", end=summary(1.0, "agent_timeout")),
        served(tok, REPLIES, OBSERVATIONS, rollout="b1", group="b"),
        served(tok, REPLIES, OBSERVATIONS, rollout="c0", group="c", end=summary(0.0, "format_error")),
        Trajectory("c1", "t", "c", error="SandboxError: no start"),
    ]
    graded = MaskingPolicy()
    assert mask_reasons(trajectories, graded) == [None, "env_error", None, None, None, "no_episode"]
    masked = MaskingPolicy(time_limits=TimeLimitEnds.MASKED)
    assert mask_reasons(trajectories, masked)[2] == "agent_timeout"
    group = MaskingPolicy(time_limits=TimeLimitEnds.MASKED, scope=MaskScope.GROUP)
    assert mask_reasons(trajectories, group) == [
        "group:env_error",
        "env_error",
        "agent_timeout",
        "group:agent_timeout",
        "group:no_episode",
        "no_episode",
    ]

    sequences = merged_sequences(trajectories, masking=group)
    assert [s.masked for s in sequences] == [True] * 6
    assert all(sum(s.response_mask) == 0 and s.reward == 0.0 for s in sequences)
    assert sequences[-1].response_ids == [] and sequences[-1].turns == 0  # one entry per rollout, even this one
    rows = step_rows(trajectories, masking=graded)
    assert {r.rollout_id for r in rows if r.masked} == {"a1"}  # c1 has no turn, so no row
    assert all(sum(r.loss_mask) == 0 and r.reward == 0.0 for r in rows if r.masked)
    assert group_indices(trajectories) == [0, 0, 1, 1, 2, 2]


def test_a_turn_the_engine_refused_is_skipped_but_text_without_ids_is_an_error():
    tok = ChatML()
    trajectory = served(tok, REPLIES[:1], OBSERVATIONS, end=summary(0.0, "context_limit", turns=2))
    trajectory.turns.append(TurnRecord(reply="", finish_reason="context_length"))  # no tokens were generated
    (sequence,) = merged_sequences([trajectory])
    assert sequence.turns == 1 and not sequence.masked and sequence.reward == 0.0
    assert len(step_rows([trajectory])) == 1

    trajectory.turns.append(TurnRecord(reply="typed by hand", finish_reason="stop"))
    with pytest.raises(TrainingDataError, match="return_token_ids"):
        merged_sequences([trajectory])


def test_missing_logprobs_give_none_and_mismatched_logprobs_are_refused():
    tok = ChatML()
    trajectory = served(tok, REPLIES, OBSERVATIONS)
    first, second = trajectory.turns
    trajectory.turns[1] = TurnRecord(**{**second.__dict__, "logprobs": None})
    (sequence,) = merged_sequences([trajectory])
    assert sequence.response_logprobs is None and sum(sequence.response_mask) == len(first.token_ids) + len(
        second.token_ids
    )
    trajectory.turns[1] = TurnRecord(**{**second.__dict__, "logprobs": [0.0]})
    with pytest.raises(TrainingDataError, match="1 logprobs for"):
        merged_sequences([trajectory])
