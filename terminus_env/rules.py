"""The rules of an episode, as pure functions: what a model's turn means, and what each way of ending implies.

The env does the I/O (the terminal, grading) around two calls: :func:`judge_reply` before anything runs, and
:func:`judge_after_commands` once the turn's commands ran. Both take the counters so far and return new ones,
so every rule here is unit-tested without Docker, and the table of end reasons in the README and the docs is
generated from :class:`EndReason` (:func:`end_reason_table`) and checked against it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass

from terminus_env.protocol import ParsedReply, Strictness, parse_reply, prompts, salvage_truncated
from terminus_env.utils.named import Named as _Named


class Fault(_Named):
    """Whose doing an ending was. Only the infrastructure's faults may be masked by a trainer."""

    NONE = "none"
    AGENT = "agent"
    INFRASTRUCTURE = "infrastructure"


class EndReason(_Named):
    """How an episode ended (``info["end_reason"]``); a ``str``, so it compares and serialises as its value."""

    TASK_COMPLETE = "task_complete"
    AGENT_TIMEOUT = "agent_timeout"
    MAX_TURNS = "max_turns"
    SHELL_LOST = "shell_lost"
    FORMAT_ERROR = "format_error"
    TURN_TRUNCATED = "turn_truncated"
    CONTEXT_LIMIT = "context_limit"
    RESOURCE_LIMIT = "resource_limit"
    VERIFIER_BROKEN = "verifier_broken"
    TAMPERED = "tampered"
    ENV_ERROR = "env_error"

    @property
    def graded(self) -> bool:
        """The verifier runs and its reward counts; otherwise the reward is 0."""
        return _ENDINGS[self][0]

    @property
    def truncated(self) -> bool:
        """Gymnasium's ``truncated``: a time or turn limit ended the episode, not the task."""
        return _ENDINGS[self][1]

    @property
    def fault(self) -> Fault:
        return _ENDINGS[self][2]

    @property
    def masked(self) -> bool:
        """A trainer should drop the episode: its reward says nothing of the model (the infrastructure failed)."""
        return self.fault is Fault.INFRASTRUCTURE

    @property
    def event(self) -> str:
        return _ENDINGS[self][3]


_ENDINGS: dict[EndReason, tuple[bool, bool, Fault, str]] = {
    EndReason.TASK_COMPLETE: (True, False, Fault.NONE, "`task_complete` confirmed (asked twice, as Terminus does)"),
    EndReason.AGENT_TIMEOUT: (True, True, Fault.NONE, "the task's agent time limit passed"),
    EndReason.MAX_TURNS: (True, True, Fault.NONE, "`max_turns` turns were played (rejected and truncated included)"),
    EndReason.SHELL_LOST: (
        True, False, Fault.AGENT,
        "the agent broke its own terminal: `exit`, Ctrl-D, `kill -9 -1`, `tmux kill-server`",
    ),
    EndReason.FORMAT_ERROR: (False, False, Fault.AGENT, "strict only: a rejected turn (no `<response>`, or no "
                             "`<commands>` while not complete)"),
    EndReason.TURN_TRUNCATED: (False, False, Fault.AGENT, "strict only: a turn that filled the per-turn token limit"),
    EndReason.CONTEXT_LIMIT: (False, False, Fault.AGENT, "the conversation no longer fits the model's context"),
    EndReason.RESOURCE_LIMIT: (
        False, False, Fault.AGENT,
        "the agent exhausted its sandbox: wrote more than `storage_mb`, or left no pid or memory for the verifier",
    ),
    EndReason.VERIFIER_BROKEN: (
        False, False, Fault.AGENT,
        "the agent left the container unable to verify: removed or broke the verifier's shell, its user, its folders",
    ),
    EndReason.TAMPERED: (
        False, False, Fault.AGENT,
        "train (by default): the verdict was the agent's, not the verifier's: code the agent provided ran before the "
        "tests began or in the verifier's runtime, or the agent's program wrote the reward "
        "(`info['episode']['tampering']`)",
    ),
    EndReason.ENV_ERROR: (
        False, False, Fault.INFRASTRUCTURE,
        "Docker failed, the host's side raised, a sandbox did not start, the container was stopped from outside",
    ),
}  # fmt: skip


def end_reason_table() -> str:
    """The table of end reasons the README and docs/environment.md show, from the rules themselves."""
    rows = ["| `end_reason` | what happened | graded | `truncated` | whose fault | masked |", "| --- " * 6 + "|"]
    for reason in EndReason:
        yes = {True: "yes", False: "no, reward 0"}
        rows.append(
            f"| `{reason.value}` | {reason.event} | {yes[reason.graded]} | {str(reason.truncated).lower()} "
            f"| {reason.fault.value} | {'yes' if reason.masked else 'no'} |"
        )
    return "\n".join(rows)


@dataclass(frozen=True)
class Reply:
    """A model reply with what the inference engine reported about it, and the context length of the model that
    wrote it (``max_model_len``), so that a reply cut because prompt and reply filled the context is told from one
    cut at the per-turn limit."""

    text: str
    finish_reason: str = "stop"
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    max_model_len: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            kind = type(self.text).__name__
            hint = " (decode bytes first)" if isinstance(self.text, (bytes, bytearray)) else ""
            raise TypeError(f"Reply.text must be a str, not {kind}{hint}")
        if not isinstance(self.finish_reason, str):
            raise TypeError(f"Reply.finish_reason must be a str, not {type(self.finish_reason).__name__}")
        for name in ("completion_tokens", "prompt_tokens", "max_model_len"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise TypeError(f"Reply.{name} must be a non-negative int or None, not {value!r}")


def as_reply(action: object) -> Reply:
    """The env's action as a Reply; anything but a str or a Reply is refused before the episode changes."""
    if isinstance(action, Reply):
        return action
    if isinstance(action, str):
        return Reply(text=action)
    hint = " (decode bytes first)" if isinstance(action, (bytes, bytearray)) else ""
    raise TypeError(f"an action is the model's reply: a str or a terminus_env.Reply, not {type(action).__name__}{hint}")


class Failure(_Named):
    """What the host can show about a sandbox failure. Whose fault it was is decided here, in one place: each
    sandbox error says what it shows (``SandboxError.shows``), :func:`failure_shown` weighs it against what the host
    saw, and :func:`ending_after` turns the result into an end reason."""

    AGENT_LIMIT = "agent_limit"
    """The agent's processes exhausted the sandbox: pids, memory (the OOM killer took the daemon), disk."""
    AGENT_BROKE = "agent_broke"
    """What the agent did to the container made a request impossible (a program, user or folder it removed)."""
    TERMINAL_LOST = "terminal_lost"
    """The agent's shell or its tmux server is gone."""
    INFRASTRUCTURE = "infrastructure"
    """Docker failed, the host's side raised, or the container was stopped from outside."""


def lost_by_agent(running: bool, oom_killed: bool) -> bool:
    """Whether a lost control daemon was the agent's doing. Nothing inside the container can see or signal the
    daemon, the container's init or its main process, and the OOM killer takes every process of the agent's and
    the verifier's first (``sandbox/inside/processes.py``). So a daemon that died while its container runs did so
    under the memory the agent holds, or on state the agent made (a traceback of ours in its stderr does not show
    which: fail closed), and a container that ended was stopped from outside (Docker, the host, its lifetime),
    unless Docker says the OOM killer ended it."""
    return running or oom_killed


def failure_shown(error_shows: Failure, *, limit_broken: bool, daemon_lost_to_agent: bool) -> Failure:
    """What a sandbox failure shows, from what its error says (``SandboxError.shows``) and what the host saw: a
    limit the agent broke (the disk watch) or a daemon it starved (:func:`lost_by_agent`) outranks the error that
    surfaced first, which may be only the consequence."""
    if limit_broken or daemon_lost_to_agent:
        return Failure.AGENT_LIMIT
    return error_shows


def ending_after(failure: Failure, *, grading: bool, reason: EndReason | None = None) -> EndReason:
    """How an episode ends after a sandbox failure, in a turn or while grading the ending ``reason``.

    Fail closed: only what the host can show was the infrastructure's is masked. An ending that was already the
    agent's fault stays the agent's whatever fails while grading it."""
    if failure is Failure.AGENT_LIMIT:
        return EndReason.RESOURCE_LIMIT
    if failure is Failure.AGENT_BROKE:
        return EndReason.VERIFIER_BROKEN if grading else EndReason.SHELL_LOST
    if failure is Failure.TERMINAL_LOST:
        return EndReason.SHELL_LOST
    if grading and reason is not None and reason.fault is Fault.AGENT:
        return reason
    return EndReason.ENV_ERROR


class TamperPolicy(_Named):
    """What a verifier run that the agent tampered with (``sandbox/tamper.py``) does to the episode."""

    FAIL = "fail"
    """End ``tampered``: reward 0, the agent's fault (training's default: a cheat must never earn reward)."""
    REPORT = "report"
    """Keep the verifier's reward and list the findings beside it (evaluation's default, comparable with public
    results, whose harnesses do not look)."""

    @classmethod
    def for_mode(cls, mode: str) -> TamperPolicy:
        return cls.FAIL if mode == "train" else cls.REPORT


def tamper_ending(findings: Collection[object], policy: TamperPolicy) -> EndReason | None:
    """How a graded episode whose verifier run raised ``findings`` ends under ``policy``, or None when the grade
    stands: ``tampered`` when there is any finding (each names what the agent provided that decided the verdict)."""
    if not findings or policy is TamperPolicy.REPORT:
        return None
    return EndReason.TAMPERED


@dataclass(frozen=True)
class TurnLimits:
    """What bounds a turn and an episode, besides the task's time limit."""

    strictness: Strictness
    max_turn_tokens: int = 16384
    max_context_tokens: int | None = None
    max_turns: int | None = None
    confirm_completion: bool = True
    # The agent loop may summarize the conversation (lenient evaluation): a reply that filled the context is then a
    # truncated turn, as Terminus 2 treats it, and the next turn starts from a summary; otherwise it ends the episode.
    summarizes: bool = False


@dataclass(frozen=True)
class Counters:
    """What the env counts over an episode; ``info`` and the episode summary report them."""

    turn: int = 0
    format_errors: int = 0
    opening_streak: int = 0  # rejected turns at the start of the episode
    opened: bool = False  # an accepted turn ends the opening streak for good
    truncated_turns: int = 0
    warnings: int = 0
    awaiting_confirmation: bool = False
    summarizations: int = 0  # lenient evaluation only: the conversation was summarized and replaced


@dataclass(frozen=True)
class Verdict:
    """What a turn means. Exactly one of ``end`` (the episode ends), ``run`` (run these commands) and ``feedback``
    (nothing runs; this is the next observation) is set, except after commands, where neither may be."""

    counters: Counters
    end: EndReason | None = None
    run: ParsedReply | None = None
    feedback: str | None = None
    confirm: bool = False  # after commands: ask the model to confirm completion
    format_error: str | None = None
    warnings: tuple[str, ...] = ()


def judge_reply(reply: Reply, counters: Counters, limits: TurnLimits, *, out_of_time: bool) -> Verdict:
    """The meaning of a reply before anything runs: end the episode, run its commands, or feed back an error."""
    counters = dataclasses.replace(counters, turn=counters.turn + 1)
    if _context_exceeded(reply, limits):
        return Verdict(counters, end=EndReason.CONTEXT_LIMIT)
    if out_of_time:  # the model's own thinking time counts, as in Harbor
        return Verdict(counters, end=EndReason.AGENT_TIMEOUT)
    text, salvage_warning = reply.text, tuple[str, ...]()
    if _turn_truncated(reply, limits):
        counters = dataclasses.replace(counters, truncated_turns=counters.truncated_turns + 1)
        if limits.strictness.strict_truncation:
            return Verdict(counters, end=EndReason.TURN_TRUNCATED)
        salvaged = salvage_truncated(text)
        if salvaged is None:
            counters = dataclasses.replace(counters, opened=True, awaiting_confirmation=False)
            return _within_turns(Verdict(counters, feedback=prompts.truncated_feedback(limits.max_turn_tokens)), limits)
        text = salvaged
        salvage_warning = ("The reply hit the token limit; only the part up to </response> was used.",)
    parsed = parse_reply(text)
    warnings = salvage_warning + tuple(parsed.warnings)
    counters = dataclasses.replace(counters, warnings=counters.warnings + len(warnings))
    if parsed.error is not None:
        counters = dataclasses.replace(
            counters,
            format_errors=counters.format_errors + 1,
            opening_streak=counters.opening_streak + (0 if counters.opened else 1),
            awaiting_confirmation=False,
        )
        if limits.strictness.strict_format:
            return Verdict(counters, end=EndReason.FORMAT_ERROR, format_error=parsed.error, warnings=warnings)
        feedback = prompts.rejected_feedback(parsed)
        return _within_turns(Verdict(counters, feedback=feedback, format_error=parsed.error, warnings=warnings), limits)
    return Verdict(dataclasses.replace(counters, opened=True), run=parsed, warnings=warnings)


def judge_after_commands(
    parsed: ParsedReply, counters: Counters, limits: TurnLimits, *, out_of_time: bool, warnings: tuple[str, ...] = ()
) -> Verdict:
    """After a turn's commands ran: the time limit, a confirmed completion, or a request to confirm it."""
    if out_of_time:
        return Verdict(counters, end=EndReason.AGENT_TIMEOUT, warnings=warnings)
    if parsed.task_complete and (not limits.confirm_completion or counters.awaiting_confirmation):
        return Verdict(counters, end=EndReason.TASK_COMPLETE, warnings=warnings)
    counters = dataclasses.replace(counters, awaiting_confirmation=parsed.task_complete)
    return _within_turns(Verdict(counters, confirm=parsed.task_complete, warnings=warnings), limits)


def _within_turns(verdict: Verdict, limits: TurnLimits) -> Verdict:
    if limits.max_turns is not None and verdict.counters.turn >= limits.max_turns:
        return dataclasses.replace(verdict, end=EndReason.MAX_TURNS, feedback=None, confirm=False)
    return verdict


def _context_exceeded(reply: Reply, limits: TurnLimits) -> bool:
    if reply.finish_reason == "context_length" or (_filled_context(reply) and not limits.summarizes):
        return True
    limit = limits.max_context_tokens
    return limit is not None and reply.prompt_tokens is not None and reply.prompt_tokens > limit


def _filled_context(reply: Reply) -> bool:
    """A reply cut because prompt and reply reached the model's context: the next turn cannot fit, whatever the
    per-turn limit, so this is the context's end, not a truncated turn."""
    used = (reply.prompt_tokens or 0) + (reply.completion_tokens or 0)
    return (
        reply.finish_reason == "length"
        and reply.max_model_len is not None
        and reply.prompt_tokens is not None
        and reply.completion_tokens is not None
        and used >= reply.max_model_len
    )


def _turn_truncated(reply: Reply, limits: TurnLimits) -> bool:
    if reply.finish_reason == "length":
        return True
    return reply.completion_tokens is not None and reply.completion_tokens >= limits.max_turn_tokens
