"""``TerminusEnv``: one terminal task as a Gymnasium environment, spoken to in the Terminus 2 protocol.

An action is the model's whole reply (text, or a :class:`Reply` carrying what the engine said about
it); an observation is the next user message. The async methods (``areset``, ``astep``,
``aclose``) are the core; ``reset``/``step``/``close`` run them on the process-wide background loop
(:func:`terminus_env.bridge.shared_loop`), so sync envs can share one warm ``SandboxPool``.

For many rollouts at once, prefer :class:`terminus_env.rollout.RolloutRunner` over
``gymnasium.make_vec``: it runs every episode on one event loop with a shared sandbox pool and
serving pool, while vector envs step their copies in lock-step.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import re
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
from gymnasium import spaces

from terminus_env.bridge import shared_loop
from terminus_env.protocol import (
    MAX_COMMAND_DURATION,
    ParsedReply,
    Strictness,
    parse_reply,
    prompts,
    salvage_truncated,
)
from terminus_env.sandbox import Sandbox, SandboxError, SandboxPool
from terminus_env.tasks import Task, find_task, grade, task_image

Mode = Literal["train", "eval"]
MAX_TEXT_LENGTH = 1 << 20
END_REASONS = (
    "task_complete",
    "format_error",
    "turn_truncated",
    "context_limit",
    "agent_timeout",
    "max_turns",
    "env_error",
)


@dataclass(frozen=True)
class Reply:
    """A model reply with what the inference engine reported about it."""

    text: str
    finish_reason: str = "stop"
    completion_tokens: int | None = None
    prompt_tokens: int | None = None


@dataclass(frozen=True)
class EpisodeSummary:
    """How an episode ended; ``info["episode"]`` holds it as a dict."""

    task: str
    reward: float
    end_reason: str
    turns: int
    format_errors: int
    format_error_opening_streak: int
    warnings: int
    truncated_turns: int
    graded: bool
    env_error: bool
    rescued: bool
    grade_reason: str | None = None
    error: str | None = None


@dataclass
class _Counters:
    turn: int = 0
    format_errors: int = 0
    opening_streak: int = 0
    opened: bool = False  # an accepted turn ends the opening streak for good
    truncated_turns: int = 0
    warnings: int = 0
    awaiting_confirmation: bool = False


@dataclass
class _Episode:
    sandbox: Sandbox | None
    started: float
    loop: asyncio.AbstractEventLoop
    counters: _Counters = field(default_factory=_Counters)
    summary: EpisodeSummary | None = None


@dataclass(frozen=True)
class _Outcome:
    obs: str
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    format_error: str | None = None
    warnings: tuple[str, ...] = ()

    @property
    def ended(self) -> bool:
        return self.terminated or self.truncated


class TerminusEnv(gym.Env[str, "str | Reply"]):
    """A terminal task in a hardened Docker sandbox.

    ``mode="train"`` is strict by default (``SWE_STRICT_FORMAT``/``SWE_STRICT_TRUNCATION``): a
    rejected or truncated turn ends the episode with reward 0, ungraded, so that a rescued format
    error can never earn a positive advantage. ``mode="eval"`` is lenient by default, like
    Terminal-Bench. ``info["end_reason"]`` says how an episode ended; ``info["env_error"]`` marks
    episodes a trainer should mask.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(
        self,
        task: Task | str | Path,
        *,
        mode: Mode = "train",
        strict_format: bool | None = None,
        strict_truncation: bool | None = None,
        max_turn_tokens: int = 16384,
        max_context_tokens: int | None = None,
        max_turns: int | None = None,
        confirm_completion: bool = True,
        sandbox_pool: SandboxPool | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        if max_turn_tokens <= 0:
            raise ValueError(f"max_turn_tokens must be positive, got {max_turn_tokens}")
        if max_turns is not None and max_turns <= 0:
            raise ValueError(f"max_turns must be positive or None, got {max_turns}")
        self.task = task if isinstance(task, Task) else find_task(task)
        self.mode = mode
        self.strictness = Strictness.from_env(
            mode, strict_format=strict_format, strict_truncation=strict_truncation, environ=environ
        )
        self.max_turn_tokens = max_turn_tokens
        self.max_context_tokens = max_context_tokens
        self.max_turns = max_turns
        self.confirm_completion = confirm_completion
        self.observation_space = _text_space()
        self.action_space = _text_space()
        self._pool = sandbox_pool
        self._bridge = shared_loop()  # one loop for every sync env, so they can share a SandboxPool
        self._episode: _Episode | None = None
        self._image: str | None = None
        self._messages: list[dict[str, str]] = []
        self._timings: dict[str, list[float]] = {"reset": [], "step": [], "grade": []}

    # ----- public API -------------------------------------------------------------------------
    @property
    def messages(self) -> list[dict[str, str]]:
        """The whole conversation so far, OpenAI chat style."""
        return list(self._messages)

    @property
    def episode_summary(self) -> EpisodeSummary | None:
        """How the current episode ended, or None while it runs."""
        return self._episode.summary if self._episode else None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        return self._bridge.run(self.areset(seed=seed, options=options))

    def step(self, action: str | Reply) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return self._bridge.run(self.astep(action))

    def close(self) -> None:
        episode = self._episode
        if episode is not None and episode.loop is not self._bridge.loop:
            _close_on_foreign_loop(episode.loop, self.aclose())
        elif episode is not None:
            self._bridge.run(self.aclose())

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        await self._release_sandbox()
        started = time.monotonic()
        if self._image is None:
            self._image = await task_image(self.task)
        spec = self.task.sandbox_spec(self._image)
        sandbox = await (self._pool.acquire(spec) if self._pool else Sandbox.start(spec))
        self._episode = _Episode(sandbox=sandbox, started=time.monotonic(), loop=asyncio.get_running_loop())
        screen = await sandbox.terminal.screen()
        await sandbox.terminal.capture_new()  # later turns show only what is new after this point
        obs = _fit(prompts.initial_prompt(self.task.instruction, screen))
        self._messages = [{"role": "user", "content": obs}]
        self._timings["reset"].append(time.monotonic() - started)
        return obs, {"messages": self.messages, "task": self.task.name, "turn": 0}

    async def astep(self, action: str | Reply) -> tuple[str, float, bool, bool, dict[str, Any]]:
        episode = self._require_episode()
        reply = action if isinstance(action, Reply) else Reply(text=str(action))
        episode.counters.turn += 1
        self._messages.append({"role": "assistant", "content": reply.text})
        started = time.monotonic()
        try:
            outcome = await self._play_turn(episode, reply)
            if not outcome.ended and self.max_turns is not None and episode.counters.turn >= self.max_turns:
                outcome = await self._end(
                    episode, "max_turns", format_error=outcome.format_error, warnings=outcome.warnings
                )
        except SandboxError as exc:
            outcome = await self._end(episode, "env_error", error=f"{type(exc).__name__}: {exc}")
        self._timings["step"].append(time.monotonic() - started)
        return self._step_result(episode, outcome)

    async def aclose(self) -> None:
        await self._release_sandbox()

    def metrics(self) -> dict[str, float]:
        """Wall-clock timings (kept out of ``info`` so that ``info`` stays comparable across runs)."""
        out: dict[str, float] = {}
        for name, values in self._timings.items():
            out[f"{name}_count"] = float(len(values))
            out[f"{name}_s_mean"] = sum(values) / len(values) if values else 0.0
            out[f"{name}_s_max"] = max(values, default=0.0)
        return out

    # ----- one turn ----------------------------------------------------------------------------
    async def _play_turn(self, episode: _Episode, reply: Reply) -> _Outcome:
        counters = episode.counters
        if self._context_exceeded(reply):
            return await self._end(episode, "context_limit")
        if self._out_of_time(episode):  # the model's own thinking time counts, as in Harbor
            return await self._end(episode, "agent_timeout")
        text = reply.text
        salvage_warning: list[str] = []
        if self._turn_truncated(reply):
            counters.truncated_turns += 1
            if self.strictness.strict_truncation:
                return await self._end(episode, "turn_truncated")
            salvaged = salvage_truncated(text)
            if salvaged is None:
                counters.opened = True
                counters.awaiting_confirmation = False
                return _Outcome(obs=prompts.truncated_feedback(self.max_turn_tokens))
            text = salvaged
            salvage_warning = ["The reply hit the token limit; only the part up to </response> was used."]

        parsed = parse_reply(text)
        warnings = tuple(salvage_warning + list(parsed.warnings))
        counters.warnings += len(warnings)
        if parsed.error is not None:
            return await self._rejected(episode, parsed, warnings)
        counters.opened = True
        return await self._execute(episode, parsed, warnings)

    async def _rejected(self, episode: _Episode, parsed: ParsedReply, warnings: tuple[str, ...]) -> _Outcome:
        counters = episode.counters
        counters.format_errors += 1
        if not counters.opened:
            counters.opening_streak += 1
        counters.awaiting_confirmation = False
        if self.strictness.strict_format:
            return await self._end(episode, "format_error", format_error=parsed.error, warnings=warnings)
        return _Outcome(obs=prompts.rejected_feedback(parsed), format_error=parsed.error, warnings=warnings)

    async def _execute(self, episode: _Episode, parsed: ParsedReply, warnings: tuple[str, ...]) -> _Outcome:
        terminal = _sandbox(episode).terminal
        for command in parsed.commands:
            if self._out_of_time(episode):
                break
            duration = min(command.duration, MAX_COMMAND_DURATION, self._time_left(episode))
            await terminal.send(command.keystrokes, duration)
        output = await terminal.capture_new()
        counters = episode.counters
        if self._out_of_time(episode):
            return await self._end(episode, "agent_timeout", warnings=warnings)
        if parsed.task_complete and (not self.confirm_completion or counters.awaiting_confirmation):
            return await self._end(episode, "task_complete", warnings=warnings)
        if parsed.task_complete:
            counters.awaiting_confirmation = True
            obs = prompts.confirm_completion_prompt(output.text, is_screen=output.is_screen)
        else:
            counters.awaiting_confirmation = False
            obs = prompts.output_feedback(output.text, list(warnings), is_screen=output.is_screen)
        return _Outcome(obs=obs, warnings=warnings)

    # ----- endings -----------------------------------------------------------------------------
    async def _end(
        self,
        episode: _Episode,
        reason: str,
        *,
        format_error: str | None = None,
        warnings: tuple[str, ...] = (),
        error: str | None = None,
    ) -> _Outcome:
        """Finish the episode; only completion and the two time limits are graded, as in Harbor."""
        graded = reason in ("task_complete", "agent_timeout", "max_turns")
        reward, grade_reason = 0.0, None
        if graded:
            started = time.monotonic()
            try:
                result = await grade(_sandbox(episode), self.task)
            except SandboxError as exc:
                reason, graded, error = "env_error", False, f"grading failed: {type(exc).__name__}: {exc}"
            else:
                reward, grade_reason = result.reward, result.reason
            self._timings["grade"].append(time.monotonic() - started)
        counters = episode.counters
        episode.summary = EpisodeSummary(
            task=self.task.name,
            reward=reward,
            end_reason=reason,
            turns=counters.turn,
            format_errors=counters.format_errors,
            format_error_opening_streak=counters.opening_streak,
            warnings=counters.warnings,
            truncated_turns=counters.truncated_turns,
            graded=graded,
            env_error=reason == "env_error",
            rescued=counters.format_errors > 0 and reward > 0,
            grade_reason=grade_reason,
            error=error,
        )
        await self._release_sandbox(keep_episode=True)
        truncated = reason in ("agent_timeout", "max_turns")
        return _Outcome(
            obs="",
            reward=reward,
            terminated=not truncated,
            truncated=truncated,
            format_error=format_error,
            warnings=warnings,
        )

    def _step_result(self, episode: _Episode, outcome: _Outcome) -> tuple[str, float, bool, bool, dict[str, Any]]:
        counters = episode.counters
        obs = _fit(outcome.obs)
        new_messages = [self._messages[-1]]
        if not outcome.ended:
            user = {"role": "user", "content": obs}
            self._messages.append(user)
            new_messages.append(user)
        info: dict[str, Any] = {
            "turn": counters.turn,
            "format_error": outcome.format_error,
            "warnings": list(outcome.warnings),
            "format_errors": counters.format_errors,
            "format_error_opening_streak": counters.opening_streak,
            "truncated_turns": counters.truncated_turns,
            "new_messages": new_messages,
        }
        if episode.summary is not None:
            info["end_reason"] = episode.summary.end_reason
            info["env_error"] = episode.summary.env_error
            info["episode"] = asdict(episode.summary)
        return obs, float(outcome.reward), outcome.terminated, outcome.truncated, info

    # ----- helpers -----------------------------------------------------------------------------
    def _require_episode(self) -> _Episode:
        episode = self._episode
        if episode is None:
            raise RuntimeError("call reset() before step()")
        if episode.summary is not None:
            raise RuntimeError(
                f"the episode already ended ({episode.summary.end_reason}); call reset() to start another"
            )
        if episode.loop is not asyncio.get_running_loop():
            raise RuntimeError("this episode lives on another event loop: use either the sync or the async API per env")
        return episode

    def _context_exceeded(self, reply: Reply) -> bool:
        if reply.finish_reason == "context_length":
            return True
        limit = self.max_context_tokens
        return limit is not None and reply.prompt_tokens is not None and reply.prompt_tokens > limit

    def _turn_truncated(self, reply: Reply) -> bool:
        if reply.finish_reason == "length":
            return True
        return reply.completion_tokens is not None and reply.completion_tokens >= self.max_turn_tokens

    def _time_left(self, episode: _Episode) -> float:
        limit = self.task.agent_timeout_s
        if limit is None:
            return float("inf")
        return limit - (time.monotonic() - episode.started)

    def _out_of_time(self, episode: _Episode) -> bool:
        return self._time_left(episode) <= 0

    async def _release_sandbox(self, keep_episode: bool = False) -> None:
        episode = self._episode
        if episode is None:
            return
        if not keep_episode:
            self._episode = None
        sandbox, episode.sandbox = episode.sandbox, None
        if sandbox is None:
            return
        if self._pool is not None:
            await self._pool.release(sandbox)
        else:
            await sandbox.close()


def _sandbox(episode: _Episode) -> Sandbox:
    if episode.sandbox is None:
        raise RuntimeError("the episode's sandbox was already released")
    return episode.sandbox


def _close_on_foreign_loop(loop: asyncio.AbstractEventLoop, coro: Any) -> None:
    """Close an episode that an async user started, from sync ``close()`` (e.g. a Gymnasium wrapper)."""
    if loop.is_closed():
        coro.close()
        return
    if loop.is_running():
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            loop.create_task(coro)  # cannot block inside the loop; the close finishes right after
        else:
            asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=60)
        return
    loop.run_until_complete(coro)


_OUTSIDE_BMP = re.compile("[\ud800-\udfff\U00010000-\U0010ffff]")
_CHARSET = "".join(chr(c) for c in range(0x10000) if not 0xD800 <= c <= 0xDFFF)


def _fit(text: str) -> str:
    """Make text fit the Text space: basic-plane characters only, at most MAX_TEXT_LENGTH long."""
    if not text.isascii():
        text = _OUTSIDE_BMP.sub("\ufffd", text)
    return text[:MAX_TEXT_LENGTH]


@functools.lru_cache(maxsize=1)
def _text_space_prototype() -> spaces.Text:
    return spaces.Text(max_length=MAX_TEXT_LENGTH, min_length=0, charset=_CHARSET)


def _text_space() -> spaces.Text:
    """A Text space over the basic multilingual plane (building one costs ~1 s, so copy a prototype)."""
    space = copy.copy(_text_space_prototype())
    space._np_random = None  # each env seeds its own generator
    return space
