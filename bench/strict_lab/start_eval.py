"""What the start model does, measured on the replicas before any GRPO step: per task, how often it solves the task,
how often its first turn is rejected, and whether such a rollout still solves the task (lenient rules show both the
error and its rescue). These numbers set what GRPO can see: a group whose rollouts all earn the same reward moves
nothing, and under lenient rules a rescued error is pushed up only when it beats its group."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from strict_lab.grpo_run import rollout_row
from terminus_env.records.metrics import aggregate
from terminus_env.rollout import RolloutRunner, ServingPolicy
from terminus_env.serving import ServingPool
from terminus_env.serving.weight_sync import CheckpointReload
from terminus_env.tasks import Task

LENIENT = {"mode": "train", "strict_format": False, "strict_truncation": False}


async def evaluate(
    start: str, urls: Sequence[str], served_model: str, tasks: Sequence[Task], *, rollouts_per_task: int,
    max_turns: int, max_turn_tokens: int, max_sandboxes: int,
) -> dict[str, Any]:  # fmt: skip
    """``rollouts_per_task`` lenient rollouts of every task from the ``start`` weights (loaded into the replicas)."""
    async with ServingPool(list(urls), served_model) as pool:
        await pool.sync_weights(CheckpointReload(start), version="start")
        policy = ServingPolicy(pool, max_tokens=max_turn_tokens, sampling={"temperature": 1.0})
        runner = RolloutRunner(policy, env_kwargs={**LENIENT, "max_turns": max_turns}, max_sandboxes=max_sandboxes)
        trajectories = await runner.run(list(tasks), group_size=rollouts_per_task)
    rows = [rollout_row(0, i, rollouts_per_task, t) for i, t in enumerate(trajectories)]
    first_prompts = {t.task: t.messages[0]["content"] for t in trajectories if t.messages}  # for strict_lab.probe
    return {"rows": rows, "per_task": {t.name: summary([r for r in rows if r["task"] == t.name]) for t in tasks},
            "overall": summary(rows), "first_prompts": first_prompts}  # fmt: skip


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Solve rate, first-turn rejections, format errors, and the solve rate with and without a rejected first turn."""
    metrics = aggregate(rows)
    scored = [r for r in rows if not r["env_error"]]
    rejected = [r["reward"] for r in scored if r["first_turn_rejected"]]
    accepted = [r["reward"] for r in scored if not r["first_turn_rejected"]]
    return {
        "rollouts": metrics.episodes,
        "env_errors": metrics.env_errors,
        "solve_rate": metrics.mean_reward,
        "first_turn_rejected": sum(r["first_turn_rejected"] for r in scored) / len(scored) if scored else 0.0,
        "format_errors_per_rollout": metrics.mean_format_errors,
        "opening_streak": metrics.mean_opening_streak,
        "rescued_rate": metrics.rescued_rate,
        "truncated_turns_per_rollout": metrics.mean_truncated_turns,
        "solve_rate_after_rejected_first_turn": sum(rejected) / len(rejected) if rejected else None,
        "solve_rate_after_accepted_first_turn": sum(accepted) / len(accepted) if accepted else None,
        "end_reasons": metrics.end_reasons,
    }
