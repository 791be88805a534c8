"""From the recorded rollouts to the figures' numbers: per step and run, the env's metrics (``aggregate``), the
policy's broken-opening probability, and the advantage GRPO gave to rollouts whose first turn was rejected.

That advantage is the whole mechanism. TRL's loss multiplies a rollout's tokens by its advantage, so the sum of the
advantages of the rollouts that opened broken is what pushes a broken opening up (positive) or down (negative). It is
computed as TRL 1.16 computes advantages (``scale_rewards="group"``): reward minus the group's mean, over the group's
standard deviation (with Bessel's correction) plus 1e-4; a masked rollout (env error) is left out of its group.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from terminus_env.records.metrics import aggregate

SERIES = (
    ("mean_format_errors", "format errors per rollout"),
    ("mean_opening_streak", "opening streak"),
    ("rescued_rate", "rescued rate"),
    ("mean_reward", "mean reward"),
    ("p_broken_opening", "P(no opening <response>), the policy's"),
    ("broken_opening_push", "advantage on broken openings, summed over steps"),
)


def advantages(rows: Sequence[dict[str, Any]]) -> list[float | None]:
    """Each row's GRPO advantage within its (step, group); None for a masked row."""
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, row in enumerate(rows):
        if not row["env_error"]:
            groups[(row["step"], row["group"])].append(i)
    result: list[float | None] = [None] * len(rows)
    for members in groups.values():
        rewards = [rows[i]["reward"] for i in members]
        mean = sum(rewards) / len(rewards)
        std = statistics.stdev(rewards) if len(rewards) > 1 else 0.0
        for i in members:
            result[i] = (rows[i]["reward"] - mean) / (std + 1e-4)
    return result


def step_metrics(rows: Sequence[dict[str, Any]], probe: float | None) -> dict[str, Any]:
    """One step of one run."""
    metrics = aggregate(rows)
    scored = [(r, a) for r, a in zip(rows, advantages(rows)) if a is not None]
    rescued = [a for r, a in scored if r["rescued"]]
    broken = [a for r, a in scored if r["first_turn_rejected"]]
    return {
        "mean_format_errors": metrics.mean_format_errors,
        "mean_opening_streak": metrics.mean_opening_streak,
        "rescued_rate": metrics.rescued_rate,
        "mean_reward": metrics.mean_reward,
        "p_broken_opening": probe,
        "first_turn_rejected": len(broken) / len(scored) if scored else 0.0,
        "broken_opening_advantage": sum(broken),
        "rescued": len(rescued),
        "rescued_won": sum(a > 0 for a in rescued),
        "broken_openings": len(broken),
        "broken_opening_reward": sum(r["reward"] for r, _ in scored if r["first_turn_rejected"]),
        "clean_opening_reward": sum(r["reward"] for r, _ in scored if not r["first_turn_rejected"]),
        "scored": len(scored),
        "mixed_groups": _mixed_groups(rows),
        "env_errors": metrics.env_errors,
        "end_reasons": metrics.end_reasons,
    }


def _mixed_groups(rows: Sequence[dict[str, Any]]) -> float:
    """The share of groups whose rewards differ: only these move the policy."""
    groups: dict[int, set[float]] = defaultdict(set)
    for row in rows:
        if not row["env_error"]:
            groups[row["group"]].add(row["reward"])
    return sum(len(r) > 1 for r in groups.values()) / len(groups) if groups else 0.0


def load_run(folder: Path) -> dict[str, Any]:
    """A run, finished (``run.json``) or stopped early (the steps whose rollouts all came back): its strictness, and
    its steps' metrics."""
    if (folder / "run.json").is_file():
        run = json.loads((folder / "run.json").read_text())
        entries, strictness, seed = run["steps"], run["strictness"], run["config"]["seed"]
    else:
        entries = [json.loads(line) for line in (folder / "steps.jsonl").read_text().splitlines() if line]
        strictness = json.loads((folder / "strictness.json").read_text())
        seed = json.loads((folder / "config.json").read_text())["seed"]
    rows = [json.loads(line) for line in (folder / "rollouts.jsonl").read_text().splitlines() if line]
    steps, push = [], 0.0
    for entry in entries:
        metrics = step_metrics([r for r in rows if r["step"] == entry["step"]], entry["p_broken_opening"])
        push += metrics["broken_opening_advantage"]
        steps.append({"step": entry["step"], **metrics, "broken_opening_push": push, "rollout_s": entry["rollout_s"],
                      "sync_s": entry.get("sync_s")})  # fmt: skip
    return {"strictness": strictness, "seed": seed, "finished": (folder / "run.json").is_file(), "steps": steps}


def arm_bands(runs: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float], list[float], list[float]]:
    """Per step over an arm's seeds: the mean, the lowest and the highest value of ``key``."""
    steps = sorted({s["step"] for run in runs for s in run["steps"]})
    means, lows, highs = [], [], []
    for step in steps:
        values = [s[key] for run in runs for s in run["steps"] if s["step"] == step and s[key] is not None]
        means.append(sum(values) / len(values))
        lows.append(min(values))
        highs.append(max(values))
    return steps, means, lows, highs


def window_means(runs: Sequence[dict[str, Any]], key: str, first: int, last: int) -> list[float]:
    """Each seed's mean of ``key`` over steps ``first``..``last`` (inclusive)."""
    result = []
    for run in runs:
        values = [s[key] for s in run["steps"] if first <= s["step"] <= last and s[key] is not None]
        result.append(sum(values) / len(values) if values else float("nan"))
    return result


def totals(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Over an arm's whole runs: rescued rollouts and how many beat their group, the broken openings' push, and the
    mean reward after a rejected and after an accepted first turn (under lenient rules, the first below the second
    means a broken opening loses its group on average, so GRPO pushes it down even there)."""
    steps = [s for run in runs for s in run["steps"]]
    broken = sum(s["broken_openings"] for s in steps)
    clean = sum(s["scored"] for s in steps) - broken
    return {
        "rescued": sum(s["rescued"] for s in steps),
        "rescued_won": sum(s["rescued_won"] for s in steps),
        "broken_openings": broken,
        "reward_after_broken_opening": sum(s["broken_opening_reward"] for s in steps) / broken if broken else None,
        "reward_after_clean_opening": sum(s["clean_opening_reward"] for s in steps) / clean if clean else None,
        "broken_opening_advantage": sum(s["broken_opening_advantage"] for s in steps),
        "mixed_groups": sum(s["mixed_groups"] for s in steps) / len(steps) if steps else 0.0,
        "env_errors": sum(s["env_errors"] for s in steps),
    }
