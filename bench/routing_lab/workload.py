"""A synthetic agentic-RL workload for the routing benchmarks: what each rollout will ask, turn by turn.

Shaped after multi-turn terminal agents under GRPO: every rollout shares a system prompt; the G
rollouts of a group share their task prompt; a task's difficulty (shared by its group) and per-rollout
luck set a heavy-tailed number of turns; each turn generates a heavy-tailed number of tokens, then
waits a heavy-tailed time for a tool whose output joins the next prompt. Rollouts grow longer as
training goes on (``growth_per_step``), so averages measured early go stale.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class WorkloadConfig:
    steps: int = 3
    batch_size: int = 16  # prompts per training step
    group_size: int = 8  # rollouts per prompt
    system_prompt_tokens: int = 1024
    task_prompt_tokens_median: float = 1200.0
    turns_median: float = 6.0
    turns_sigma: float = 0.6  # lognormal sigma of per-rollout luck; the group's difficulty adds as much again
    max_turns: int = 48
    output_tokens_median: float = 120.0
    output_tokens_sigma: float = 0.9
    max_tokens: int = 2048  # per turn
    tool_tokens_median: float = 150.0
    tool_tokens_sigma: float = 1.0
    tool_wait_median_s: float = 0.5
    tool_wait_sigma: float = 1.0
    growth_per_step: float = 0.25  # turns and output tokens scale by 1 + growth × step
    vocab_size: int = 32000
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "group_size", "max_turns", "max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"WorkloadConfig.{name} must be at least 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class TurnPlan:
    output_len: int  # tokens the model would generate this turn (max_tokens may cut it)
    tool_tokens: tuple[int, ...]  # what the tool prints; empty after the last turn
    tool_wait_s: float  # time between this turn's answer and the next request
    output_token_ids: tuple[int, ...] = ()  # what the model generates, when it must match an HTTP run


@dataclass(frozen=True)
class RolloutPlan:
    rollout_id: str
    group_id: str
    step: int
    prompt: tuple[int, ...]
    turns: tuple[TurnPlan, ...]
    max_tokens: int


def fits(prompt_tokens: int, max_tokens: int, max_model_len: int) -> bool:
    """Whether vLLM takes the request: it refuses (HTTP 400) a prompt whose ``max_tokens`` could overrun
    ``max_model_len``, so an agent's episode ends at its context limit one turn before it would overflow."""
    return prompt_tokens + max_tokens <= max_model_len


def make_workload(config: WorkloadConfig) -> list[list[RolloutPlan]]:
    """One list of rollouts per training step, reproducible from ``config.seed``."""
    rng = np.random.default_rng(config.seed)
    system = _tokens(rng, config.system_prompt_tokens, config.vocab_size)
    return [list(_step(rng, config, system, step)) for step in range(config.steps)]


def _step(rng: np.random.Generator, cfg: WorkloadConfig, system: tuple[int, ...], step: int) -> Iterator[RolloutPlan]:
    growth = 1.0 + cfg.growth_per_step * step
    for p in range(cfg.batch_size):
        group = f"s{step}p{p}"
        task_len = max(16, int(rng.lognormal(np.log(cfg.task_prompt_tokens_median), 0.5)))
        prompt = system + _tokens(rng, task_len, cfg.vocab_size)
        difficulty = rng.lognormal(0.0, cfg.turns_sigma)
        for g in range(cfg.group_size):
            luck = rng.lognormal(0.0, cfg.turns_sigma)
            n_turns = int(np.clip(round(cfg.turns_median * difficulty * luck * growth), 1, cfg.max_turns))
            yield RolloutPlan(
                rollout_id=f"{group}g{g}",
                group_id=group,
                step=step,
                prompt=prompt,
                turns=tuple(_turn(rng, cfg, growth, last=(t == n_turns - 1)) for t in range(n_turns)),
                max_tokens=cfg.max_tokens,
            )


def _turn(rng: np.random.Generator, cfg: WorkloadConfig, growth: float, last: bool) -> TurnPlan:
    output_len = max(1, int(rng.lognormal(np.log(cfg.output_tokens_median * growth), cfg.output_tokens_sigma)))
    if last:
        return TurnPlan(output_len=output_len, tool_tokens=(), tool_wait_s=0.0)
    tool_len = max(1, int(rng.lognormal(np.log(cfg.tool_tokens_median), cfg.tool_tokens_sigma)))
    wait = float(rng.lognormal(np.log(cfg.tool_wait_median_s), cfg.tool_wait_sigma))
    return TurnPlan(output_len=output_len, tool_tokens=_tokens(rng, tool_len, cfg.vocab_size), tool_wait_s=wait)


def _tokens(rng: np.random.Generator, n: int, vocab: int) -> tuple[int, ...]:
    return tuple(rng.integers(0, vocab, size=n).tolist())
