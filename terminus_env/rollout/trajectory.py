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
    commands: list[dict[str, Any]] = field(default_factory=list)
    """The commands typed, as ``info["commands"]`` gives them: ``{"keystrokes", "duration"}``."""
    terminal: dict[str, Any] | None = None
    """What the terminal showed after them (``info["terminal"]``); None when nothing ran."""
    replied_s: float | None = None
    """When the reply arrived, in seconds after the trajectory's ``started_at``."""
    observed_s: float | None = None
    """When the turn's observation was ready (after grading, on the last turn)."""


@dataclass(frozen=True)
class SummaryCall:
    """One request of a context summarization: what was asked, what the model answered, and the engine's data."""

    role: str
    """``summary``, ``questions`` or ``answers`` (the three subagents), or ``short`` (the short summary's fallback)."""
    prompt: str
    reply: str
    finish_reason: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    replica: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    policy_version: Any = None
    replied_s: float | None = None


@dataclass(frozen=True)
class Compaction:
    """The conversation was summarized and replaced, as Terminus 2 does it (lenient evaluation only).

    Its turns' token ids stay true to what the engine saw, but the prompt after it does not extend the prompt before:
    a trainer must not merge the turns into one sequence (``terminus_env.training`` refuses to)."""

    turn: int
    """Turns played before it: it came right before the reply of ``turns[turn]``."""
    trigger: str
    """``proactive`` (fewer tokens than the threshold were free) or ``reactive`` (the server refused the request)."""
    outcome: str
    """``summary`` (the three subagents), ``short`` (one short summary), ``screen`` (no model: the task and the
    screen's last lines), or ``failed`` (a proactive attempt that did not complete: nothing was replaced)."""
    calls: list[SummaryCall] = field(default_factory=list)
    free_tokens: int | None = None
    """The context's free tokens by the last reply's counts, when the context window is known."""
    kept: int = 0
    """How many messages of ``replaced`` the summary was asked from (a reactive one first drops the latest)."""
    replaced: list[dict[str, str]] = field(default_factory=list)
    """The conversation it replaced, whole; its last message is the observation the model never answered."""
    seed: list[dict[str, str]] = field(default_factory=list)
    """The conversation that carried on; the model answered its last message next."""
    at_s: float | None = None


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
    started_at: float | None = None
    """Unix time the rollout started; the ``*_s`` times count from here, so recordings can be replayed."""
    ready_s: float | None = None
    """When the sandbox was up and the first observation ready."""
    screen: str | None = None
    """The terminal's screen in the first observation."""
    grade_s: float | None = None
    """How long grading took, when the verifier ran."""
    verifier: dict[str, str] | None = None
    """The verifier's files by their names in a Harbor trial's ``verifier/`` folder (``info["verifier"]``)."""
    compactions: list[Compaction] = field(default_factory=list)
    """Each context summarization, in order (lenient evaluation only)."""

    @property
    def reward(self) -> float:
        return self.summary.reward if self.summary else 0.0

    @property
    def summarized(self) -> bool:
        """The conversation was replaced by a summary at least once: its turns are not one token sequence."""
        return any(c.outcome != "failed" for c in self.compactions)

    @property
    def masked(self) -> bool:
        """A trainer drops this rollout: the infrastructure failed it, or it never ran (no episode summary)."""
        return self.summary.masked if self.summary else True

    @property
    def env_error(self) -> bool:
        """The former name of :attr:`masked`, kept for one release."""
        return self.masked

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
