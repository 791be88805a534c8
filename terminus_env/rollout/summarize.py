"""Context summarization, as Terminus 2 does it: lenient evaluation's way past a full context.

When a conversation nears the model's context, Terminus 2 (Harbor's ``enable_summarize``, on by default) asks the
model for a summary of the work, asks a fresh context for the questions that summary leaves open, asks the full
conversation for the answers, and carries on in a new conversation: the first message, the questions asked with
the summary, the questions, and the answers. It does so

- **proactively**, before a turn, when fewer than ``threshold`` tokens (default 8,000) stay free;
- **reactively**, when the server refuses a request for its length: the latest exchanges are first dropped until
  4,000 tokens are free, and when the three requests fail, a short summary, then the task and the screen's last
  1,000 characters, carry on instead. Should the server refuse the new conversation too, the task and the screen's
  end alone carry on (where Terminus 2 answers itself "technical difficulties" and goes on).

Training never summarizes: the env refuses (:meth:`TerminusEnv.compact`), and a conversation that no longer fits
ends the episode (``context_limit``, reward 0). The rules (when, how far back) are pure functions here; the
:class:`Summarizer` makes the requests through the rollout's policy and records each summarization in the
trajectory (:class:`Compaction`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from terminus_env.env import TerminusEnv
from terminus_env.protocol import prompts
from terminus_env.rollout.policy import Policy, PolicyOutput, Rollout
from terminus_env.rollout.trajectory import Compaction, SummaryCall, Trajectory, TurnRecord

DEFAULT_THRESHOLD = 8000
"""Terminus 2's ``proactive_summarization_threshold``: summarize before a turn when fewer tokens stay free."""
UNWIND_FREE_TOKENS = 4000
"""Before a reactive summary, the latest exchanges are dropped until this many tokens are free."""
SCREEN_TAIL_CHARS = 1000
"""How much of the screen's end the fallbacks show."""
_FAILED = ("context_length", "length")


@dataclass(frozen=True)
class SummarizeConfig:
    """Whether and when the agent loop summarizes (lenient evaluation; Terminus 2's defaults)."""

    enabled: bool = True
    threshold: int = DEFAULT_THRESHOLD
    """Free tokens under which a summary is made before the next turn; 0 turns the proactive summary off."""
    context_window: int | None = None
    """The model's context in tokens (the server's ``max_model_len``); unknown, only the reactive summary runs."""

    def __post_init__(self) -> None:
        if self.threshold < 0:
            raise ValueError(f"the summarization threshold is a number of free tokens, at least 0: {self.threshold}")
        if self.context_window is not None and self.context_window <= 0:
            raise ValueError(f"context_window must be positive, got {self.context_window}")


# --- the rules (pure) ------------------------------------------------------------------------------------------


def effective_threshold(threshold: int, window: int) -> int:
    """The proactive threshold, at most half the context: on a context under twice the threshold, Terminus 2's rule
    would summarize before every turn (a 4,096-token model always has fewer than 8,000 tokens free)."""
    return min(threshold, window // 2)


def proactive_due(config: SummarizeConfig, used: int | None) -> int | None:
    """The free tokens when a proactive summary is due before the next turn, else None. ``used``: the conversation's
    tokens without its pending observation, as the last reply's prompt and completion counts give them."""
    window = config.context_window
    if not config.enabled or config.threshold == 0 or window is None or used is None:
        return None
    free = window - used
    return free if free < effective_threshold(config.threshold, window) else None


def segment_turns(trajectory: Trajectory) -> Sequence[TurnRecord]:
    """The turns of the current conversation (since the last summarization that replaced it)."""
    done = [c for c in trajectory.compactions if c.outcome != "failed"]
    return trajectory.turns[done[-1].turn :] if done else trajectory.turns


def used_tokens(turns: Sequence[TurnRecord]) -> int | None:
    """The conversation's tokens up to its last reply, by the engine's counts of that reply; None when unknown."""
    if not turns or turns[-1].prompt_tokens is None or turns[-1].completion_tokens is None:
        return None
    return turns[-1].prompt_tokens + turns[-1].completion_tokens


def unwind_point(turns: Sequence[TurnRecord], seed_length: int, window: int | None, target_free: int) -> int:
    """How many messages of the conversation a reactive summary keeps: whole exchanges, the latest dropped until
    ``target_free`` tokens are free (Terminus 2's unwinding). The conversation is ``seed_length`` messages (the task's,
    or those a summary started it with), then each turn's reply and observation. When no exchange leaves enough free,
    only the task's first message stays, as Terminus 2 unwinds down to it."""
    if window is None or not turns:
        return max(seed_length + 2 * len(turns) - 1, seed_length)  # all but the unanswered observation
    for index in range(len(turns) - 1, -1, -1):
        used = used_tokens(turns[: index + 1])
        if used is not None and window - used >= target_free:
            return seed_length + 2 * index + 1
    return 1


# --- the requests ----------------------------------------------------------------------------------------------


class Summarizer:
    """Summarizes a rollout's conversation through its policy, and records it in the trajectory."""

    def __init__(self, policy: Policy, config: SummarizeConfig, clock: Callable[[], float]) -> None:
        self._policy = policy
        self.config = config
        self._clock = clock

    async def before_turn(self, env: TerminusEnv, rollout: Rollout, trajectory: Trajectory) -> None:
        """A proactive summary when the context is nearly full; a failed one changes nothing (Terminus 2 goes on)."""
        if not env.summarizes:
            return
        free = proactive_due(self.config, used_tokens(segment_turns(trajectory)))
        if free is not None:
            trajectory.compactions.append(await self._summarize(env, rollout, trajectory, "proactive", free))

    async def after_overflow(
        self, env: TerminusEnv, rollout: Rollout, trajectory: Trajectory, refused: PolicyOutput
    ) -> PolicyOutput:
        """The server refused the request for its length: summarize (falling back as Terminus 2 does) and ask again.
        If the new conversation is refused too, it is replaced by the task and the screen's end alone, and asked once
        more; the reply to the last request (a refusal ends the episode: ``context_limit``)."""
        if not (self.config.enabled and env.summarizes):
            return refused
        used = used_tokens(segment_turns(trajectory))
        window = self.config.context_window
        free = None if window is None or used is None else window - used
        trajectory.compactions.append(await self._summarize(env, rollout, trajectory, "reactive", free))
        out = await self._policy.act(rollout, env.messages)
        if out.reply.finish_reason != "context_length":
            return out
        messages = env.messages
        tail = (await env.ascreen())[-SCREEN_TAIL_CHARS:]
        seed = [messages[0], _user(prompts.screen_handoff(rollout.task.instruction, tail))]
        replaced = env.compact(seed)
        trajectory.compactions.append(Compaction(turn=len(trajectory.turns), trigger="reactive", outcome="screen",
                                                 kept=1, replaced=replaced, seed=seed, at_s=self._clock()))  # fmt: skip
        return await self._policy.act(rollout, env.messages)

    async def _summarize(
        self, env: TerminusEnv, rollout: Rollout, trajectory: Trajectory, trigger: str, free: int | None
    ) -> Compaction:
        """A proactive summary asks from the whole conversation and fails quietly; a reactive one first drops the
        latest exchanges, and always ends with a conversation that carries on."""
        messages = env.messages
        turns = segment_turns(trajectory)
        reactive = trigger == "reactive"
        kept = len(messages) - 1  # all but the observation the model has not answered
        if reactive:
            kept = unwind_point(turns, len(messages) - 2 * len(turns), self.config.context_window, UNWIND_FREE_TOKENS)
        history = messages[:kept]
        instruction = rollout.task.instruction
        calls: list[SummaryCall] = []
        seed = await self._three_requests(env, rollout, messages[0], history, instruction, calls)
        outcome = "summary"
        if seed is None and not reactive:
            return Compaction(turn=len(trajectory.turns), trigger=trigger, outcome="failed", calls=calls,
                              free_tokens=free, kept=kept, at_s=self._clock())  # fmt: skip
        if seed is None:
            tail = (await env.ascreen())[-SCREEN_TAIL_CHARS:]
            short = await self._ask(rollout, "short", [], prompts.short_summary_request(instruction, tail), calls)
            if short is not None:
                outcome, seed = "short", [*history, _user(prompts.short_summary_handoff(instruction, short))]
            else:
                outcome, seed = "screen", [*history, _user(prompts.screen_handoff(instruction, tail))]
        replaced = env.compact(seed)
        return Compaction(turn=len(trajectory.turns), trigger=trigger, outcome=outcome, calls=calls, free_tokens=free,
                          kept=kept, replaced=replaced, seed=seed, at_s=self._clock())  # fmt: skip

    async def _three_requests(
        self, env: TerminusEnv, rollout: Rollout, first: dict[str, str], history: list[dict[str, str]],
        instruction: str, calls: list[SummaryCall],
    ) -> list[dict[str, str]] | None:  # fmt: skip
        """The summary, the questions, the answers; the conversation they start, or None when one fails."""
        asked = prompts.summary_request(instruction)
        summary = await self._ask(rollout, "summary", history, asked, calls)
        if summary is None:
            return None
        question_prompt = prompts.questions_request(instruction, summary, await env.ascreen())
        questions = await self._ask(rollout, "questions", [], question_prompt, calls)
        if questions is None:
            return None
        context = [*history, _user(asked), {"role": "assistant", "content": summary}]
        answers = await self._ask(rollout, "answers", context, prompts.answers_request(questions), calls)
        if answers is None:
            return None
        return [first, _user(question_prompt), {"role": "assistant", "content": questions},
                _user(prompts.handoff(answers))]  # fmt: skip

    async def _ask(
        self, rollout: Rollout, role: str, context: list[dict[str, str]], prompt: str, calls: list[SummaryCall]
    ) -> str | None:
        """One request; its reply, or None when the context overflowed or the reply was cut."""
        out = await self._policy.act(rollout, [*context, _user(prompt)])
        calls.append(_call(role, prompt, out, self._clock()))
        return None if out.reply.finish_reason in _FAILED else out.reply.text


def _user(content: str) -> dict[str, str]:
    return {"role": "user", "content": content}


def _call(role: str, prompt: str, out: PolicyOutput, at: float) -> SummaryCall:
    return SummaryCall(role=role, prompt=prompt, **out.record_fields(), replied_s=at)
