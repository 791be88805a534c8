"""A training run's step log: one JSON line per batch of rollouts, the figures a training run's page plots.

Trainers send their own metrics to their own dashboards (TRL's ``env/...``, SkyRL's ``terminus/...``) and keep no
trace of how the episodes of each step ended. :class:`StepLog` appends one line per batch: the batch metrics of
:func:`terminus_env.records.metrics.aggregate` (mean reward, end reasons, format errors, turns, tampering), the tokens,
and the rollouts a trainer masks (:func:`terminus_env.training.mask_reasons`, the one mapping from endings to masks).
Each line is written whole and flushed, so a run that crashes keeps every step before the crash::

    log = StepLog("run/steps.jsonl")
    for step in range(1, steps + 1):
        trajectories = await runner.run(tasks, group_size=8)
        log.add(trajectories, step=step)
        ...  # train on them

``terminus-env view run/steps.jsonl`` then writes the run's page (:mod:`terminus_env.viewer`). The TRL adapter
writes one when given ``step_log`` (``examples/train_grpo.py`` does).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from terminus_env.errors import TerminusError
from terminus_env.records.metrics import aggregate
from terminus_env.rollout.trajectory import Trajectory
from terminus_env.rules import EndReason
from terminus_env.training import DEFAULT_MASKING, MaskingPolicy, mask_reasons

KIND = "training_step"
"""Every line's ``kind``: what tells a step log from an eval's run file."""
FORMAT_VERSION = 1


class StepLogError(TerminusError, ValueError):
    """A step log cannot be read; the message says what to do instead."""


@dataclass(frozen=True)
class StepRecord:
    """One batch of rollouts. Means are over its scored episodes (all but the env errors), as the adapters log them."""

    step: int
    episodes: int
    mean_reward: float
    end_reasons: dict[str, int]
    mean_format_errors: float
    mean_opening_streak: float
    rescued_rate: float
    mean_turns: float
    mean_prompt_tokens: float | None
    """Prompt tokens per episode, summed over its turns; None when the policy reported none."""
    mean_completion_tokens: float | None
    tampered: int
    tamper_rate: float
    env_errors: int
    masked: int
    """Rollouts a trainer does not learn from, under the masking policy the log was given."""
    mask_reasons: dict[str, int] = field(default_factory=dict)
    extra: dict[str, float] = field(default_factory=dict)
    """The caller's own figures for the step (its rollout time, the trainer's loss)."""

    @property
    def masked_rate(self) -> float:
        return self.masked / self.episodes if self.episodes else 0.0

    def share(self, reason: str) -> float:
        """The share of the step's episodes that ended so."""
        return self.end_reasons.get(reason, 0) / self.episodes if self.episodes else 0.0


def step_record(
    step: int, trajectories: Sequence[Trajectory], masking: MaskingPolicy = DEFAULT_MASKING,
    extra: Mapping[str, float] | None = None,
) -> StepRecord:  # fmt: skip
    """The record of one batch. A rollout that never ran (no episode summary) counts as an ``env_error``, as the
    eval records it."""
    episodes = [t.summary if t.summary is not None else _NEVER_RAN for t in trajectories]
    metrics = aggregate(episodes)
    scored = [t for t in trajectories if not t.masked]
    reasons = [reason for reason in mask_reasons(trajectories, masking) if reason is not None]
    return StepRecord(
        step=step,
        episodes=metrics.episodes,
        mean_reward=metrics.mean_reward,
        end_reasons=dict(Counter(metrics.end_reasons).most_common()),
        mean_format_errors=metrics.mean_format_errors,
        mean_opening_streak=metrics.mean_opening_streak,
        rescued_rate=metrics.rescued_rate,
        mean_turns=metrics.mean_turns,
        mean_prompt_tokens=_mean_tokens(scored, "prompt_tokens"),
        mean_completion_tokens=_mean_tokens(scored, "completion_tokens"),
        tampered=metrics.tampered_count,
        tamper_rate=metrics.tamper_rate,
        env_errors=metrics.env_errors,
        masked=len(reasons),
        mask_reasons=dict(Counter(reasons).most_common()),
        extra={name: float(value) for name, value in (extra or {}).items()},
    )


class StepLog:
    """A step log being written: :meth:`add` appends one batch's line (created with its folder when missing)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._last_step = 0

    def add(
        self, trajectories: Sequence[Trajectory], *, step: int | None = None,
        masking: MaskingPolicy = DEFAULT_MASKING, extra: Mapping[str, float] | None = None,
    ) -> StepRecord:  # fmt: skip
        """Record one batch as ``step`` (by default, the step after the last one added)."""
        record = step_record(self._last_step + 1 if step is None else step, trajectories, masking, extra)
        self._last_step = record.step
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"kind": KIND, "version": FORMAT_VERSION, **asdict(record)}) + "\n"
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(line)  # one write of one whole line: a crash leaves whole lines, or a torn last one
            handle.flush()
            os.fsync(handle.fileno())
        return record


def is_step_log(path: Path) -> bool:
    """Whether ``path``'s first line is a step log's."""
    try:
        with Path(path).open("rb") as handle:
            first = json.loads(handle.readline())
    except (OSError, ValueError):
        return False
    return isinstance(first, dict) and first.get("kind") == KIND


def read_step_log(path: Path) -> list[StepRecord]:
    """Every whole line of a step log (a line torn by a crash, the last one, is left out)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise StepLogError(f"cannot read {path} ({exc})") from exc
    lines = data[: data.rfind(b"\n") + 1].splitlines()
    names = {f.name for f in fields(StepRecord)}
    records = []
    for number, line in enumerate(lines, 1):
        try:
            entry = json.loads(line)
            if entry.pop("kind") != KIND or entry.pop("version") != FORMAT_VERSION:
                raise ValueError(f"not a version {FORMAT_VERSION} step record")
            records.append(StepRecord(**{k: v for k, v in entry.items() if k in names}))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise StepLogError(f"{path}:{number}: not a training step record ({exc}); was it edited by hand?") from exc
    if not records:
        raise StepLogError(f"{path} holds no whole step yet; look again once the first step has ended")
    return records


_NEVER_RAN: dict[str, Any] = {"end_reason": EndReason.ENV_ERROR.value, "masked": True}
"""The episode summary of a rollout that never ran: counted, never in a mean."""


def _mean_tokens(trajectories: Sequence[Trajectory], key: str) -> float | None:
    totals = []
    for trajectory in trajectories:
        counts = [getattr(turn, key) for turn in trajectory.turns if getattr(turn, key) is not None]
        if counts:
            totals.append(sum(counts))
    return sum(totals) / len(totals) if totals else None
