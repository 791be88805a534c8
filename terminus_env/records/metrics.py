"""Per-batch rollout metrics: the numbers worth plotting at every training step.

The format-error figures are there to catch one failure of training early: a rising ``mean_opening_streak`` with
``rescued_rate > 0`` means the policy is learning to waste its first turn on a malformed reply that lenient parsing
rescues.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any


@dataclass(frozen=True)
class DriftCounts:
    """Turns whose prompt did not extend the previous prompt plus completion (``terminus_env.training``)."""

    drifted_turns: int = 0
    realigned_tokens: int = 0
    drifted_rollouts: int = 0


@dataclass(frozen=True)
class BatchMetrics:
    episodes: int
    mean_reward: float
    mean_format_errors: float
    mean_opening_streak: float
    rescued_count: int
    rescued_rate: float
    mean_truncated_turns: float
    truncated_turns: int
    mean_turns: float
    env_errors: int
    end_reasons: dict[str, int] = field(default_factory=dict)
    tampered_count: int = 0
    tamper_rate: float = 0.0
    """The share of scored episodes whose verifier ran something the agent changed in its runtime: a policy learning
    to cheat shows here first, in training (where they score 0) and in evaluation (where they are only reported)."""
    drifted_turns: int = 0
    realigned_tokens: int = 0
    drifted_rollouts: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def aggregate(episodes: Iterable[Any], drift: DriftCounts | None = None) -> BatchMetrics:
    """Summarise episode summaries: ``info["episode"]`` dicts, ``EpisodeSummary`` objects or trajectories.

    Episodes flagged ``masked`` count in ``env_errors`` and ``end_reasons`` but not in the means,
    since trainers mask them. ``drift`` (from ``terminus_env.training.drift_counts``) adds the token
    drift the training-data builder met in the same batch.
    """
    drift = drift or DriftCounts()
    rows = [_as_mapping(e) for e in episodes]
    scored = [r for r in rows if not r.get("masked", r.get("env_error", False))]
    n = len(scored)
    rescued = sum(1 for r in scored if r["format_errors"] > 0 and r["reward"] > 0)
    truncated = sum(int(r["truncated_turns"]) for r in scored)
    tampered = sum(1 for r in scored if r.get("tampering"))
    return BatchMetrics(
        episodes=len(rows),
        mean_reward=_mean(r["reward"] for r in scored),
        mean_format_errors=_mean(r["format_errors"] for r in scored),
        mean_opening_streak=_mean(r["format_error_opening_streak"] for r in scored),
        rescued_count=rescued,
        rescued_rate=rescued / n if n else 0.0,
        mean_truncated_turns=truncated / n if n else 0.0,
        truncated_turns=truncated,
        mean_turns=_mean(r["turns"] for r in scored),
        env_errors=len(rows) - n,
        end_reasons=dict(Counter(str(r["end_reason"]) for r in rows)),
        tampered_count=tampered,
        tamper_rate=tampered / n if n else 0.0,
        drifted_turns=drift.drifted_turns,
        realigned_tokens=drift.realigned_tokens,
        drifted_rollouts=drift.drifted_rollouts,
    )


def _as_mapping(episode: Any) -> Mapping[str, Any]:
    summary = getattr(episode, "summary", None)  # a Trajectory carries its summary
    if summary is not None:
        episode = summary
    if is_dataclass(episode) and not isinstance(episode, type):
        return asdict(episode)
    if isinstance(episode, Mapping):
        return episode
    raise TypeError(f"cannot read an episode summary from {type(episode).__name__}")


def _mean(values: Iterable[float]) -> float:
    items = [float(v) for v in values]
    return sum(items) / len(items) if items else 0.0
