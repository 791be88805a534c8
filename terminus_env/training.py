"""Training data from trajectories: step-wise rows and merged token sequences, built from engine token ids.

Every token here is one the inference engine reported (``prompt_token_ids`` and ``token_ids`` per
turn); nothing is re-tokenized from text. A merged sequence is the first prompt, then each turn's
completion (loss mask 1, its logprobs) and the environment's tokens between turns (mask 0, logprob
0.0), taken from the next turn's prompt. When that prompt does not extend the previous prompt plus
completion token for token, the turn has *drifted*; the builder says so and applies the caller's
:class:`DriftPolicy`, and the count reaches the batch metrics.

Which rollouts a trainer must not learn from is decided in one place, :func:`mask_reason`.
"""

from __future__ import annotations

import enum
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from terminus_env.errors import TerminusError
from terminus_env.records.metrics import DriftCounts
from terminus_env.rollout.trajectory import Trajectory, TurnRecord
from terminus_env.rules import EndReason

# How an episode ended, as the env reports it today (``EpisodeSummary.end_reason``).


class TrainingDataError(TerminusError, ValueError):
    """A trajectory cannot become training data as it is; the message says which turn and why."""


class TokenDriftError(TrainingDataError):
    """A turn's prompt does not extend the previous prompt plus completion (raised under ``DriftPolicy.RAISE``)."""


class DriftPolicy(enum.Enum):
    """What the merged builder does with a drifted turn."""

    SPLIT = "split"  # start a new sequence at the drifted turn, whose prompt is what the engine saw
    REALIGN = "realign"  # keep one sequence: tokens past the divergence become the new prompt's, as context (mask 0)
    RAISE = "raise"  # refuse the trajectory with a TokenDriftError


class TimeLimitEnds(enum.Enum):
    """How episodes cut off by ``agent_timeout`` or ``max_turns`` train."""

    GRADED = "graded"  # the verifier's reward counts (the env's eval semantics, Terminal-Bench's)
    MASKED = "masked"  # not learnt from (SkyRL's Harbor integration)


class MaskScope(enum.Enum):
    """How far a masked rollout's mask reaches."""

    ROW = "row"  # that rollout only
    GROUP = "group"  # every rollout of its GRPO group (SkyRL's Harbor integration)


@dataclass(frozen=True)
class MaskingPolicy:
    """Which rollouts a trainer must not learn from. Env errors are always masked."""

    time_limits: TimeLimitEnds = TimeLimitEnds.GRADED
    scope: MaskScope = MaskScope.ROW


DEFAULT_MASKING = MaskingPolicy()


def mask_reason(trajectory: Trajectory, policy: MaskingPolicy) -> str | None:
    """Why a rollout is masked on its own, or None when it trains. The one mapping from endings to masks.

    A rollout without a summary never ran (its sandbox failed to start); a masked end reason
    (``EndReason.masked``: ``env_error``, the infrastructure's fault) says nothing of the model. Endings the agent
    caused (a format error, a truncated turn, a full context, a broken shell, a resource limit) train with
    their reward: masking them would hide the agent's own failures from it.
    """
    summary = trajectory.summary
    if summary is None:
        return "no_episode"
    reason = EndReason(summary.end_reason)  # a plain string when the trajectory was read back from JSON
    if reason.masked or (reason.truncated and policy.time_limits is TimeLimitEnds.MASKED):
        return reason.value
    return None


def mask_reasons(trajectories: Sequence[Trajectory], policy: MaskingPolicy) -> list[str | None]:
    """:func:`mask_reason` per rollout, widened to whole groups under ``MaskScope.GROUP``."""
    reasons = [mask_reason(t, policy) for t in trajectories]
    if policy.scope is MaskScope.ROW:
        return reasons
    group_reason: dict[str, str] = {}
    for trajectory, reason in zip(trajectories, reasons, strict=True):
        if reason is not None:
            group_reason.setdefault(trajectory.group_id, reason)
    return [
        reason or (f"group:{group_reason[t.group_id]}" if t.group_id in group_reason else None)
        for t, reason in zip(trajectories, reasons, strict=True)
    ]


@dataclass(frozen=True)
class StepRow:
    """One turn as a training row: the prompt the engine saw, and what it generated."""

    rollout_id: str
    group_id: str
    task: str
    turn: int
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float] | None
    reward: float  # the episode's reward on the last step, 0.0 on the others
    is_last_step: bool
    stop_reason: str
    masked: bool
    mask_reason: str | None
    policy_version: Any = None
    sampling: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MergedSequence:
    """A whole trajectory (or, after a split, one drift-free part of it) as one token sequence.

    Every part of a split trajectory carries the trajectory's reward: the outcome is the episode's.
    """

    rollout_id: str
    group_id: str
    task: str
    prompt_ids: list[int]
    response_ids: list[int]  # completions (mask 1) and the environment's tokens between them (mask 0)
    response_mask: list[int]
    response_logprobs: list[float] | None  # 0.0 where the mask is 0; None when a turn came without logprobs
    reward: float
    masked: bool
    mask_reason: str | None
    turns: int  # completions in this sequence
    drifted_turns: int
    realigned_tokens: int  # tokens of the sequence so far that a realignment replaced
    segment: int = 0  # > 0 for the parts after a split
    last_segment: bool = True
    stop_reason: str = ""  # the engine's finish_reason of the last turn
    policy_versions: tuple[Any, ...] = ()
    end_reason: str | None = None  # how the episode ended (EndReason's value); None when it never ran


def step_rows(trajectories: Sequence[Trajectory], masking: MaskingPolicy = DEFAULT_MASKING) -> list[StepRow]:
    """One row per model turn; the reward sits on each trajectory's last step."""
    rows: list[StepRow] = []
    for trajectory, reason in zip(trajectories, mask_reasons(trajectories, masking), strict=True):
        turns = _token_turns(trajectory)
        masked = reason is not None
        for index, turn in turns:
            last = index == turns[-1][0]
            rows.append(
                StepRow(
                    rollout_id=trajectory.rollout_id,
                    group_id=trajectory.group_id,
                    task=trajectory.task,
                    turn=index,
                    prompt_ids=list(turn.prompt_token_ids or []),
                    response_ids=list(turn.token_ids or []),
                    loss_mask=[0 if masked else 1] * len(turn.token_ids or []),
                    logprobs=list(turn.logprobs) if turn.logprobs is not None else None,
                    reward=_reward(trajectory, masked) if last else 0.0,
                    is_last_step=last,
                    stop_reason=turn.finish_reason,
                    masked=masked,
                    mask_reason=reason,
                    policy_version=turn.policy_version,
                    sampling=dict(turn.sampling),
                )
            )
    return rows


def merged_sequences(
    trajectories: Sequence[Trajectory],
    drift: DriftPolicy = DriftPolicy.REALIGN,
    masking: MaskingPolicy = DEFAULT_MASKING,
) -> list[MergedSequence]:
    """One sequence per trajectory (more under ``DriftPolicy.SPLIT`` when a turn drifted).

    A trajectory with no model tokens at all (its sandbox never started) gives one empty, masked
    sequence, so that a batch keeps one entry per rollout.
    """
    out: list[MergedSequence] = []
    for trajectory, reason in zip(trajectories, mask_reasons(trajectories, masking), strict=True):
        out.extend(merge_trajectory(trajectory, drift, reason))
    return out


def merge_trajectory(trajectory: Trajectory, drift: DriftPolicy, mask: str | None = None) -> list[MergedSequence]:
    """The merged sequence(s) of one trajectory; ``mask`` is its :func:`mask_reason`."""
    if trajectory.summarized:
        raise TrainingDataError(
            f"rollout {trajectory.rollout_id}: its conversation was summarized and replaced (lenient evaluation's "
            "context summarization), so its turns are not one token sequence; train on rollouts of train-mode envs, "
            "or build step-wise rows (step_rows)"
        )
    turns = _token_turns(trajectory)
    builder = _Builder(trajectory, mask)
    if not turns:
        return [builder.finish(last=True)]
    segments: list[MergedSequence] = []
    for position, (index, turn) in enumerate(turns):
        prompt = list(turn.prompt_token_ids or [])
        if position == 0:
            builder.start(prompt)
        else:
            common = _common_prefix(builder.tokens, prompt)
            if common < len(builder.tokens):
                builder.drifted_turns += 1
                if drift is DriftPolicy.RAISE:
                    raise TokenDriftError(_drift_message(trajectory, index, builder.tokens, prompt, common))
                if drift is DriftPolicy.SPLIT:
                    segments.append(builder.finish(last=False))
                    builder = builder.next_segment(prompt)
                else:
                    builder.realign(prompt, common)
            if len(builder.tokens) < len(prompt):
                builder.context(prompt[len(builder.tokens) :])
        builder.completion(turn)
    segments.append(builder.finish(last=True))
    return segments


def check_vocabulary(sequences: Iterable[MergedSequence], vocab_size: int) -> None:
    """Refuse token ids the trainer's model has no embedding for, before they crash it (``IndexError``)."""
    for s in sequences:
        top = max([*s.prompt_ids, *s.response_ids], default=-1)
        if top >= vocab_size:
            raise TrainingDataError(
                f"rollout {s.rollout_id}: token id {top} is outside the model's vocabulary of {vocab_size}: the "
                "server's tokenizer is not the trainer's. Serve the trainer's model (or, with the simulated "
                "server, pass --tokenizer PATH with the trainer's tokenizer)"
            )


def untrained_token_share(trajectories: Sequence[Trajectory], sequences: Sequence[MergedSequence]) -> float:
    """The share of the tokens the model generated in unmasked rollouts that no sequence trains on.

    Under ``DriftPolicy.REALIGN`` a drifted turn's earlier completions become context (mask 0): this
    is how much learning that costs, which ``realigned_tokens`` (context tokens included) does not say.
    """
    kept = {s.rollout_id for s in sequences if not s.masked}
    generated = sum(len(turn.token_ids or []) for t in trajectories if t.rollout_id in kept for turn in t.turns)
    trained = sum(sum(s.response_mask) for s in sequences if not s.masked)
    return (generated - trained) / generated if generated else 0.0


def drift_counts(sequences: Iterable[MergedSequence]) -> DriftCounts:
    """The drift figures of a batch, for :func:`terminus_env.records.metrics.aggregate`."""
    turns = tokens = 0
    drifted_rollouts: set[str] = set()
    for sequence in sequences:
        turns += sequence.drifted_turns
        tokens += sequence.realigned_tokens
        if sequence.drifted_turns:
            drifted_rollouts.add(sequence.rollout_id)
    return DriftCounts(drifted_turns=turns, realigned_tokens=tokens, drifted_rollouts=len(drifted_rollouts))


def group_indices(items: Sequence[StepRow | MergedSequence | Trajectory]) -> list[int]:
    """A dense group number per item (0, 0, 0, 1, 1, ...), in order of first appearance."""
    numbers: dict[str, int] = defaultdict(lambda: len(numbers))
    return [numbers[item.group_id] for item in items]


# ----- internals ---------------------------------------------------------------------------------


def _reward(trajectory: Trajectory, masked: bool) -> float:
    return 0.0 if masked else trajectory.reward


def _token_turns(trajectory: Trajectory) -> list[tuple[int, TurnRecord]]:
    """The turns that produced tokens, checked; a turn the engine refused (context full) produced none."""
    out: list[tuple[int, TurnRecord]] = []
    for index, turn in enumerate(trajectory.turns):
        if turn.token_ids is None and turn.prompt_token_ids is None and turn.reply == "":
            continue
        where = f"rollout {trajectory.rollout_id}, turn {index}"
        if turn.token_ids is None or turn.prompt_token_ids is None:
            raise TrainingDataError(
                f"{where} has no token ids: serve the policy with return_token_ids "
                "(ServingPolicy does) so training data never comes from re-tokenized text"
            )
        if turn.logprobs is not None and len(turn.logprobs) != len(turn.token_ids):
            raise TrainingDataError(
                f"{where}: {len(turn.logprobs)} logprobs for {len(turn.token_ids)} tokens; "
                "the engine's reply is corrupt"
            )
        out.append((index, turn))
    return out


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _drift_message(trajectory: Trajectory, turn: int, expected: list[int], got: list[int], at: int) -> str:
    return (
        f"rollout {trajectory.rollout_id}, turn {turn}: the prompt does not extend the previous prompt and "
        f"completion (they differ from token {at}: expected {expected[at : at + 8]}, got {got[at : at + 8]}); "
        "the chat template re-tokenizes history differently. Build step-wise rows, or pass "
        "DriftPolicy.SPLIT or DriftPolicy.REALIGN"
    )


class _Builder:
    """Accumulates one merged sequence: the first prompt, then response tokens with their mask and logprobs."""

    def __init__(self, trajectory: Trajectory, mask: str | None, segment: int = 0) -> None:
        self.trajectory = trajectory
        self.mask = mask
        self.segment = segment
        self.prompt: list[int] = []
        self.response: list[int] = []
        self.response_mask: list[int] = []
        self.logprobs: list[float] | None = []
        self.turns = 0
        self.drifted_turns = 0
        self.realigned_tokens = 0
        self.stop_reason = ""
        self.versions: list[Any] = []

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.response

    def start(self, prompt: list[int]) -> None:
        self.prompt = list(prompt)

    def context(self, ids: list[int]) -> None:
        self.response += ids
        self.response_mask += [0] * len(ids)
        if self.logprobs is not None:
            self.logprobs += [0.0] * len(ids)

    def completion(self, turn: TurnRecord) -> None:
        ids = list(turn.token_ids or [])
        self.response += ids
        self.response_mask += [1] * len(ids)
        if self.logprobs is not None and turn.logprobs is not None:
            self.logprobs += list(turn.logprobs)
        else:
            self.logprobs = None
        self.turns += 1
        self.stop_reason = turn.finish_reason
        self.versions.append(turn.policy_version)

    def realign(self, prompt: list[int], common: int) -> None:
        """Cut the sequence back to where it still agrees with ``prompt``; the caller appends the rest as context."""
        self.realigned_tokens += len(self.tokens) - common
        if common < len(self.prompt):
            self.prompt = self.prompt[:common]
            self.response, self.response_mask = [], []
            self.logprobs = [] if self.logprobs is not None else None
            return
        keep = common - len(self.prompt)
        self.response = self.response[:keep]
        self.response_mask = self.response_mask[:keep]
        if self.logprobs is not None:
            self.logprobs = self.logprobs[:keep]

    def next_segment(self, prompt: list[int]) -> _Builder:
        nxt = _Builder(self.trajectory, self.mask, self.segment + 1)
        nxt.start(prompt)
        return nxt

    def finish(self, *, last: bool) -> MergedSequence:
        t = self.trajectory
        reason = self.mask or (None if self.turns else "no_tokens")  # nothing the model generated to learn from
        masked = reason is not None
        mask = [0] * len(self.response_mask) if masked else list(self.response_mask)
        return MergedSequence(
            rollout_id=t.rollout_id,
            group_id=t.group_id,
            task=t.task,
            prompt_ids=list(self.prompt),
            response_ids=list(self.response),
            response_mask=mask,
            response_logprobs=list(self.logprobs) if self.logprobs is not None else None,
            reward=_reward(t, masked),
            masked=masked,
            mask_reason=reason,
            turns=self.turns,
            drifted_turns=self.drifted_turns,
            realigned_tokens=self.realigned_tokens,
            segment=self.segment,
            last_segment=last,
            stop_reason=self.stop_reason,
            policy_versions=tuple(self.versions),
            end_reason=str(t.summary.end_reason) if t.summary is not None else None,
        )
