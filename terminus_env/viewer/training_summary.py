"""What a training run's page shows, as data: each step's record from the step log, and the run's totals.

Pure: step records in, a :class:`TrainingSummary` out; :meth:`TrainingSummary.as_dict` is the JSON written beside the
page, each step with its shares of end reasons and its masked rate as the charts draw them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from terminus_env.records.step_log import StepRecord


@dataclass(frozen=True)
class TrainingSummary:
    name: str
    source: str
    steps: tuple[StepRecord, ...]
    """By step (a step logged twice keeps the log's order)."""
    end_reasons: dict[str, int]
    """Every end reason over the run, most common first: the layers of the shares chart, in this order."""
    episodes: int
    tampered: int
    masked: int

    def as_dict(self) -> dict[str, Any]:
        document = asdict(self)
        for entry, step in zip(document["steps"], self.steps):
            entry["end_reason_shares"] = {reason: step.share(reason) for reason in self.end_reasons}
            entry["masked_rate"] = step.masked_rate
        return document


def summarize_training(name: str, source: str, steps: Sequence[StepRecord]) -> TrainingSummary:
    reasons: Counter[str] = Counter()
    for step in steps:
        reasons.update(step.end_reasons)
    return TrainingSummary(
        name=name,
        source=source,
        steps=tuple(sorted(steps, key=lambda step: step.step)),
        end_reasons=dict(reasons.most_common()),
        episodes=sum(step.episodes for step in steps),
        tampered=sum(step.tampered for step in steps),
        masked=sum(step.masked for step in steps),
    )
