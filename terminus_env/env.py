"""``TerminusEnv``: one terminal task as a Gymnasium environment, spoken to in the Terminus 2 protocol.

An action is the model's whole reply (text, or a :class:`Reply` carrying what the engine said about
it); an observation is the next user message. The async methods (``areset``, ``astep``,
``aclose``) are the core; ``reset``/``step``/``close`` run them on the process-wide background loop
(:func:`terminus_env.utils.bridge.shared_loop`), so sync envs can share one warm ``SandboxPool``.

For many rollouts at once, prefer :class:`terminus_env.rollout.RolloutRunner` over
``gymnasium.make_vec``: it runs every episode on one event loop with a shared sandbox pool and
serving pool, while vector envs step their copies in lock-step.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym

from terminus_env.protocol import MAX_COMMAND_DURATION, Command, ParsedReply, Strictness, prompts
from terminus_env.rules import (
    Counters,
    EndReason,
    Failure,
    Fault,
    Reply,
    TamperPolicy,
    TurnLimits,
    Verdict,
    as_reply,
    ending_after,
    failure_shown,
    judge_after_commands,
    judge_reply,
    tamper_ending,
)
from terminus_env.sandbox import (
    Sandbox,
    SandboxError,
    SandboxLost,
    SandboxPool,
    TerminalOutput,
)
from terminus_env.tasks import Task, find_task, grade, task_image
from terminus_env.utils.bridge import close_on_foreign_loop, shared_loop
from terminus_env.utils.text_space import fit, text_space

__all__ = ["EndReason", "EpisodeSummary", "Fault", "Reply", "TamperPolicy", "TerminusEnv"]

Mode = Literal["train", "eval"]


@dataclass(frozen=True)
class EpisodeSummary:
    """How an episode ended; ``info["episode"]`` holds it as a dict."""

    task: str
    reward: float
    end_reason: EndReason
    turns: int
    format_errors: int
    format_error_opening_streak: int
    warnings: int
    truncated_turns: int
    graded: bool
    masked: bool
    """A trainer always drops this episode: the infrastructure failed, so its reward says nothing of the model
    (``end_reason.masked``)."""
    rescued: bool
    grade_reason: str | None = None
    error: str | None = None
    fault: Fault = Fault.NONE
    """Whose doing the ending was: nobody's, the agent's, or the infrastructure's."""
    failure: str | None = None
    """The verifier's first failing test and its assertion (`GradeResult.failure`)."""
    tampering: tuple[dict[str, str], ...] = ()
    """What the verifier ran that the agent changed in the verifier's runtime: ``{"kind", "path", "detail"}`` each
    (``sandbox/tamper.py``). In train mode (``TamperPolicy.FAIL``) such an episode ends ``tampered``."""
    summarizations: int = 0
    """How many times the conversation was summarized and replaced (:meth:`TerminusEnv.compact`, lenient eval only):
    when above 0, the turns' prompts do not extend one another."""

    @property
    def env_error(self) -> bool:
        """The former name of :attr:`masked`, kept for one release."""
        return self.masked


@dataclass
class _Episode:
    sandbox: Sandbox | None
    started: float
    loop: asyncio.AbstractEventLoop
    counters: Counters = field(default_factory=Counters)
    summary: EpisodeSummary | None = None
    verifier: dict[str, str] | None = None


@dataclass(frozen=True)
class _Outcome:
    obs: str
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    format_error: str | None = None
    warnings: tuple[str, ...] = ()
    commands: tuple[Command, ...] = ()
    """The commands typed: a turn cut short by the time limit types fewer than its reply holds."""
    terminal: TerminalOutput | None = None

    @property
    def ended(self) -> bool:
        return self.terminated or self.truncated


class TerminusEnv(gym.Env[str, "str | Reply"]):
    """A terminal task in a hardened Docker sandbox.

    ``mode="train"`` is strict by default (``SWE_STRICT_FORMAT``/``SWE_STRICT_TRUNCATION``): a
    rejected or truncated turn ends the episode with reward 0, ungraded, so that a rescued format
    error can never earn a positive advantage. ``mode="eval"`` is lenient by default, like
    Terminal-Bench. ``info["end_reason"]`` (an :class:`EndReason`) says how an episode ended and whose
    fault it was; ``info["masked"]`` marks the episodes a trainer should drop, which only the
    infrastructure's faults are.
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
        tamper: TamperPolicy | str | None = None,
        summarized: bool = False,
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
        # ``summarized``: the agent loop summarizes the conversation when it nears the context (where it may: lenient
        # evaluation), so a reply that filled the context is a truncated turn, not the episode's end.
        self.limits = TurnLimits(self.strictness, max_turn_tokens, max_context_tokens, max_turns, confirm_completion,
                                 summarizes=summarized and self.summarizes)
        self.tamper = TamperPolicy(tamper) if tamper is not None else TamperPolicy.for_mode(mode)
        self.observation_space = text_space()
        self.action_space = text_space()
        self._pool = sandbox_pool
        self._bridge = shared_loop()  # one loop for every sync env, so they can share a SandboxPool
        self._closing = threading.Lock()
        self._episode: _Episode | None = None
        self._image: str | None = None
        self._messages: list[dict[str, str]] = []
        self._timings: dict[str, list[float]] = {"reset": [], "step": [], "grade": []}

    # ----- public API -------------------------------------------------------------------------
    @property
    def max_turn_tokens(self) -> int:
        return self.limits.max_turn_tokens

    @property
    def max_turns(self) -> int | None:
        return self.limits.max_turns

    @property
    def messages(self) -> list[dict[str, str]]:
        """The whole conversation so far, OpenAI chat style."""
        return list(self._messages)

    @property
    def summarizes(self) -> bool:
        """Whether the conversation may be summarized (:meth:`compact`): lenient evaluation only. In training, and in
        strict evaluation, a conversation that no longer fits ends the episode (``context_limit``, reward 0), so that
        the token-in-token-out record stays whole."""
        return self.mode == "eval" and not (self.strictness.strict_format or self.strictness.strict_truncation)

    def compact(self, messages: Sequence[Mapping[str, str]]) -> list[dict[str, str]]:
        """Replace the conversation with a shorter one that carries on the episode (the agent loop's context
        summarization, as Terminus 2 does it); the model answers its last message next. Returns the conversation it
        replaced. The episode counts it (``info["episode"]["summarizations"]``). Refused unless :attr:`summarizes`."""
        episode = self._episode
        if episode is None or episode.summary is not None:
            raise RuntimeError("no episode runs: a conversation is summarized between the turns of a running episode")
        if not self.summarizes:
            raise RuntimeError(f"the conversation is summarized in lenient evaluation only, not in mode {self.mode!r} "
                               f"with {self.strictness}: there a conversation that no longer fits ends the episode")
        new = [{"role": str(m["role"]), "content": fit(str(m["content"]))} for m in messages]
        if not new or new[-1]["role"] != "user":
            raise ValueError("a summarized conversation ends with the user message the model answers next")
        replaced, self._messages = self._messages, new
        episode.counters = replace(episode.counters, summarizations=episode.counters.summarizations + 1)
        return replaced

    async def ascreen(self) -> str:
        """The terminal's visible screen now (what a summary's reader is shown); the episode must be running."""
        return await _sandbox(self._require_episode()).terminal.screen()

    @property
    def episode_summary(self) -> EpisodeSummary | None:
        """How the current episode ended, or None while it runs."""
        return self._episode.summary if self._episode else None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode in a fresh sandbox; see :meth:`areset`."""
        return self._bridge.run(self.areset(seed=seed, options=options))

    def step(self, action: str | Reply) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Play one model turn; see :meth:`astep`."""
        return self._bridge.run(self.astep(action))

    def close(self) -> None:
        """Release the sandbox; the shared loop stays up for other envs. Safe twice, and from two threads at once."""
        with self._closing:
            episode = self._episode
            if episode is not None and episode.loop is not self._bridge.loop:
                close_on_foreign_loop(episode.loop, self.aclose())
            elif episode is not None:
                self._bridge.run(self.aclose())

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start an episode: the previous sandbox is released and a fresh one started from the task's image.

        Args:
            seed: Gymnasium's seed (the task itself is deterministic; nothing here draws from it).
            options: unused; accepted for Gymnasium's signature.

        Returns:
            ``(observation, info)``: the first user message (the format rules, the instruction and the current
            screen), and ``info`` with:

            - ``messages``: the conversation so far (the one user message);
            - ``task``: the task's name;
            - ``turn``: 0;
            - ``screen``: the terminal as the observation shows it.

        Raises:
            SandboxError: no sandbox could start (the runner turns that into a masked trajectory).
        """
        super().reset(seed=seed)
        await self._release_sandbox()
        started = time.monotonic()
        if self._image is None:
            self._image = await task_image(self.task, self._pool)
        spec = self.task.sandbox_spec(self._image)
        sandbox = await (self._pool.acquire(spec) if self._pool else Sandbox.start(spec))
        self._episode = _Episode(sandbox=sandbox, started=time.monotonic(), loop=asyncio.get_running_loop())
        screen = await sandbox.terminal.screen()
        await sandbox.terminal.capture_new()  # later turns show only what is new after this point
        obs = fit(prompts.initial_prompt(self.task.instruction, screen))
        self._messages = [{"role": "user", "content": obs}]
        self._timings["reset"].append(time.monotonic() - started)
        return obs, {"messages": self.messages, "task": self.task.name, "turn": 0, "screen": screen}

    async def astep(self, action: str | Reply) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Play one turn.

        Args:
            action: the model's whole reply: a ``str``, or a :class:`Reply` with what the engine said about it (its
                finish reason and token counts, and the model's context length). Another type raises ``TypeError``
                and changes nothing.

        Returns:
            Gymnasium's ``(observation, reward, terminated, truncated, info)``:

            - ``observation``: the next user message, or "" once the episode ended;
            - ``reward``: 0 until the end; then the verifier's reward for a graded ending, 0 otherwise;
            - ``terminated``: the episode ended by the task or a fault;
            - ``truncated``: it ended by a time or turn limit;
            - ``info``, every turn:

              - ``turn``: turns played, this one included;
              - ``format_error``: why this reply was rejected or rescued, or None;
              - ``warnings``: the parser's warnings on this reply;
              - ``format_errors``, ``format_error_opening_streak``, ``truncated_turns``: the episode's counts;
              - ``new_messages``: the messages this turn added (the reply, and the next user message);
              - ``commands``: the commands typed, as ``{"keystrokes", "duration"}`` dicts;
              - ``terminal``: what the terminal showed after them, ``{"text", "is_screen"}``, or None;

              and once the episode ended:

              - ``end_reason``: an :class:`EndReason`, which says whose fault the ending was;
              - ``masked``: a trainer always drops this episode: the infrastructure failed, so its reward says
                nothing of the model. ``env_error`` is the same value under its former name;
              - ``episode``: the :class:`EpisodeSummary` as a dict;
              - ``verifier``: the verifier's files by their names in a Harbor trial's ``verifier/`` folder (its
                output, ``test-stdout.txt``, among them), or None when it did not run.
        """
        reply = as_reply(action)
        episode = self._require_episode()
        self._messages.append({"role": "assistant", "content": reply.text})
        started = time.monotonic()
        try:
            outcome = await self._play_turn(episode, reply)
        except SandboxError as exc:
            outcome = await self._end_on_failure(episode, exc)
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
        verdict = judge_reply(reply, episode.counters, self.limits, out_of_time=self._out_of_time(episode))
        episode.counters = verdict.counters
        sent: tuple[Command, ...] = ()
        output: TerminalOutput | None = None
        if verdict.run is not None:
            verdict, sent, output = await self._execute(episode, verdict.run, verdict.warnings)
        error, warnings = verdict.format_error, verdict.warnings
        if verdict.end is not None:
            outcome = await self._end(episode, verdict.end, format_error=error, warnings=warnings)
        else:
            outcome = _Outcome(obs=verdict.feedback or "", format_error=error, warnings=warnings)
        return replace(outcome, commands=sent, terminal=output)

    async def _execute(
        self, episode: _Episode, parsed: ParsedReply, warnings: tuple[str, ...]
    ) -> tuple[Verdict, tuple[Command, ...], TerminalOutput]:
        sandbox = _sandbox(episode)
        if sandbox.violation is not None:
            raise sandbox.violation
        left = self._time_left(episode)  # the turn's commands stop where the agent's time does, in the sandbox
        typed = [(command.keystrokes, min(command.duration, MAX_COMMAND_DURATION)) for command in parsed.commands]
        step = await sandbox.terminal.step(typed, budget=None if math.isinf(left) else max(left, 0.0))
        if sandbox.violation is not None:
            raise sandbox.violation
        sent, output = parsed.commands[: len(step.waited)], step.output
        verdict = judge_after_commands(
            parsed, episode.counters, self.limits, out_of_time=self._out_of_time(episode), warnings=warnings
        )
        episode.counters = verdict.counters
        if verdict.end is None:
            if verdict.confirm:
                obs = prompts.confirm_completion_prompt(output.text, is_screen=output.is_screen)
            else:
                obs = prompts.output_feedback(output.text, list(warnings), is_screen=output.is_screen)
            verdict = Verdict(verdict.counters, feedback=obs, warnings=warnings)
        return verdict, tuple(sent), output

    # ----- endings -----------------------------------------------------------------------------
    async def _end_on_failure(self, episode: _Episode, exc: SandboxError) -> _Outcome:
        """A sandbox failure mid-turn: the agent's doing ends it as the agent's failure, anything else masked."""
        violation = episode.sandbox.violation if episode.sandbox is not None else None
        reason = ending_after(await _failure(episode.sandbox, exc), grading=False)
        return await self._end(episode, reason, error=str(violation) if violation else f"{type(exc).__name__}: {exc}")

    async def _end(
        self,
        episode: _Episode,
        reason: EndReason,
        *,
        format_error: str | None = None,
        warnings: tuple[str, ...] = (),
        error: str | None = None,
    ) -> _Outcome:
        """Finish the episode; graded endings run the verifier, as in Harbor, unless the agent broke a limit."""
        reward, grade_reason, failure, graded = 0.0, None, None, reason.graded
        tampering: tuple[dict[str, str], ...] = ()
        if graded:
            started = time.monotonic()
            try:
                violation = await _sandbox(episode).check_disk()
                if violation is not None:
                    reason, graded, error = EndReason.RESOURCE_LIMIT, False, str(violation)
                else:
                    harbor = self.tamper is TamperPolicy.REPORT  # evaluation scores the verifier's run as Harbor does
                    result = await grade(_sandbox(episode), self.task, harbor_verdict=harbor)
                    reward, grade_reason, failure = result.reward, result.reason, result.failure
                    episode.verifier = dict(result.files)
                    tampering = tuple(finding.as_dict() for finding in result.tampering)
                    ending = tamper_ending(result.tampering, self.tamper)
                    if ending is not None:
                        reason, graded, reward = ending, False, 0.0
            except SandboxError as exc:  # the agent's processes may have starved or broken the verifier
                reason = ending_after(await _failure(episode.sandbox, exc), grading=True, reason=reason)
                graded = False
                starved = reason is EndReason.RESOURCE_LIMIT
                what = "the verifier was starved" if starved else f"grading failed: {type(exc).__name__}"
                error = f"{what}: {exc}"
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
            masked=reason.masked,
            rescued=counters.format_errors > 0 and reward > 0,
            grade_reason=grade_reason,
            error=error,
            fault=reason.fault,
            failure=failure,
            tampering=tampering,
            summarizations=counters.summarizations,
        )
        await self._release_sandbox(keep_episode=True)
        return _Outcome(
            obs="",
            reward=reward,
            terminated=not reason.truncated,
            truncated=reason.truncated,
            format_error=format_error,
            warnings=warnings,
        )

    def _step_result(self, episode: _Episode, outcome: _Outcome) -> tuple[str, float, bool, bool, dict[str, Any]]:
        counters = episode.counters
        obs = fit(outcome.obs)
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
            "commands": [asdict(command) for command in outcome.commands],
            "terminal": None if outcome.terminal is None else _terminal_info(outcome.terminal),
        }
        if episode.summary is not None:
            info["end_reason"] = episode.summary.end_reason
            info["masked"] = episode.summary.masked
            info["env_error"] = episode.summary.masked  # the former name of ``masked``, kept for one release
            info["episode"] = {**asdict(episode.summary), "env_error": episode.summary.masked}  # the same
            info["verifier"] = episode.verifier
        return obs, float(outcome.reward), outcome.terminated, outcome.truncated, info

    # ----- helpers -----------------------------------------------------------------------------
    def _require_episode(self) -> _Episode:
        episode = self._episode
        if episode is None:
            raise RuntimeError("call reset() before step()")
        if episode.summary is not None:
            raise RuntimeError(
                f"the episode already ended ({episode.summary.end_reason.value}); call reset() to start another"
            )
        if episode.loop is not asyncio.get_running_loop():
            raise RuntimeError("this episode lives on another event loop: use either the sync or the async API per env")
        return episode

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


async def _failure(sandbox: Sandbox | None, exc: SandboxError) -> Failure:
    """Gather what the host can show about a sandbox failure; the rules (``rules.failure_shown``) weigh it."""
    if sandbox is None:
        return exc.shows
    lost = isinstance(exc, SandboxLost) and await sandbox.lost_to_agent()
    return failure_shown(exc.shows, limit_broken=sandbox.violation is not None, daemon_lost_to_agent=lost)


def _terminal_info(output: TerminalOutput) -> dict[str, Any]:
    return {"text": fit(output.text), "is_screen": output.is_screen}


def _sandbox(episode: _Episode) -> Sandbox:
    if episode.sandbox is None:
        raise RuntimeError("the episode's sandbox was already released")
    return episode.sandbox
