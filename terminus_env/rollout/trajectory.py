"""What one rollout produced: the conversation, per-turn engine data for training, and how it ended."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from terminus_env.env import EpisodeSummary


@dataclass(frozen=True)
class TurnRecord:
    """One model turn, with the token-level data an RL trainer needs.

    Asynchronous RL must know which weights produced which tokens and under which sampling
    parameters (importance sampling, staleness limits), so each turn records both.
    """

    reply: str
    finish_reason: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    replica: str | None = None
    format_error: str | None = None
    warnings: list[str] = field(default_factory=list)
    sampling: dict[str, Any] = field(default_factory=dict)  # what the request asked for (max_tokens, temperature...)
    policy_version: Any = None  # which weights produced the tokens, as the policy names them (a trainer step, say)


@dataclass
class Trajectory:
    rollout_id: str
    task: str
    group_id: str
    messages: list[dict[str, str]] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    summary: EpisodeSummary | None = None
    error: str | None = None  # set when the rollout could not run at all (e.g. the sandbox did not start)
    wall_s: float = 0.0

    @property
    def reward(self) -> float:
        return self.summary.reward if self.summary else 0.0

    @property
    def env_error(self) -> bool:
        return self.summary.env_error if self.summary else True

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
