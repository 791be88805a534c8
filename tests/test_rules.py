"""The rules of an episode, without Docker: what each turn means and what each ending implies."""

from __future__ import annotations

from pathlib import Path

import pytest

from terminus_env.protocol import Strictness
from terminus_env.rules import (
    Counters,
    EndReason,
    Failure,
    Fault,
    Reply,
    TamperPolicy,
    TurnLimits,
    as_reply,
    end_reason_table,
    ending_after,
    failure_shown,
    judge_after_commands,
    judge_reply,
    lost_by_agent,
    tamper_ending,
)
from terminus_env.sandbox.errors import (
    AgentCaused,
    BrokenByAgent,
    DiskLimitExceeded,
    DockerUnavailable,
    ImageBuildError,
    ResourcesExhausted,
    SandboxError,
    SandboxLost,
    TerminalGone,
    error_kinds,
)

STRICT = TurnLimits(Strictness(True, True))
LENIENT = TurnLimits(Strictness(False, False))
SUMMARIZING = TurnLimits(Strictness(False, False), summarizes=True)  # lenient evaluation's agent loop
GOOD = '<response><analysis>a</analysis><plan>p</plan><commands><keystrokes duration="1">ls\n</keystrokes></commands>'
DONE = GOOD + "<task_complete>true</task_complete></response>"
GOOD += "</response>"
ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("page", ["README.md", "docs/environment.md"])
def test_the_docs_hold_the_end_reason_table_the_rules_define(page: str) -> None:
    assert end_reason_table() in (ROOT / page).read_text()


@pytest.mark.parametrize(
    ("reason", "graded", "truncated", "fault"),
    [
        (EndReason.TASK_COMPLETE, True, False, Fault.NONE),
        (EndReason.AGENT_TIMEOUT, True, True, Fault.NONE),
        (EndReason.MAX_TURNS, True, True, Fault.NONE),
        (EndReason.SHELL_LOST, True, False, Fault.AGENT),
        (EndReason.FORMAT_ERROR, False, False, Fault.AGENT),
        (EndReason.TURN_TRUNCATED, False, False, Fault.AGENT),
        (EndReason.CONTEXT_LIMIT, False, False, Fault.AGENT),
        (EndReason.RESOURCE_LIMIT, False, False, Fault.AGENT),
        (EndReason.ENV_ERROR, False, False, Fault.INFRASTRUCTURE),
    ],
)
def test_what_each_ending_implies(reason: EndReason, graded: bool, truncated: bool, fault: Fault) -> None:
    assert (reason.graded, reason.truncated, reason.fault) == (graded, truncated, fault)
    assert reason.masked is (fault is Fault.INFRASTRUCTURE)
    assert reason == reason.value  # a str: comparisons and JSON see the plain name


def test_only_the_infrastructure_is_ever_masked() -> None:
    assert [reason for reason in EndReason if reason.masked] == [EndReason.ENV_ERROR]


def test_any_finding_ends_a_training_episode_tampered_and_evaluation_keeps_the_reward() -> None:
    finding = {"kind": "startup_hook", "path": "/usr/lib/python311.zip", "detail": "..."}
    assert tamper_ending([], TamperPolicy.FAIL) is None
    assert tamper_ending([finding], TamperPolicy.FAIL) is EndReason.TAMPERED
    assert tamper_ending([finding], TamperPolicy.REPORT) is None  # evaluation keeps the verifier's reward


@pytest.mark.parametrize(
    ("limits", "reply", "end", "format_error"),
    [
        (STRICT, Reply("no xml here"), EndReason.FORMAT_ERROR, True),
        (STRICT, Reply(GOOD, finish_reason="length"), EndReason.TURN_TRUNCATED, False),
        (STRICT, Reply(GOOD, completion_tokens=16384), EndReason.TURN_TRUNCATED, False),
        (LENIENT, Reply(GOOD, finish_reason="context_length"), EndReason.CONTEXT_LIMIT, False),
        (TurnLimits(Strictness(False, False), max_context_tokens=10), Reply(GOOD, prompt_tokens=11),
         EndReason.CONTEXT_LIMIT, False),
        # Cut where prompt and reply filled the model's context (the engine's cap, not the per-turn limit): the
        # conversation no longer fits, in either mode, whatever the reply holds.
        (STRICT, Reply(GOOD, "length", completion_tokens=48, prompt_tokens=4048, max_model_len=4096),
         EndReason.CONTEXT_LIMIT, False),
        (LENIENT, Reply(GOOD, "length", completion_tokens=48, prompt_tokens=4048, max_model_len=4096),
         EndReason.CONTEXT_LIMIT, False),
        (LENIENT, Reply("no xml", "length", completion_tokens=96, prompt_tokens=4000, max_model_len=4096),
         EndReason.CONTEXT_LIMIT, False),
        # Refused for its length: the end in every mode (the agent loop summarizes before asking again).
        (SUMMARIZING, Reply(GOOD, finish_reason="context_length"), EndReason.CONTEXT_LIMIT, False),
        # Cut at the per-turn limit with room left in the context: a truncated turn.
        (STRICT, Reply(GOOD, "length", completion_tokens=48, prompt_tokens=4000, max_model_len=4096),
         EndReason.TURN_TRUNCATED, False),
    ],
)  # fmt: skip
def test_replies_that_end_the_episode_before_anything_runs(limits, reply, end, format_error) -> None:
    verdict = judge_reply(reply, Counters(), limits, out_of_time=False)
    assert verdict.end is end and verdict.run is None and verdict.feedback is None
    assert (verdict.format_error is not None) is format_error
    assert verdict.counters.turn == 1


def test_time_runs_out_before_the_reply_is_read() -> None:
    verdict = judge_reply(Reply("garbage"), Counters(), STRICT, out_of_time=True)
    assert verdict.end is EndReason.AGENT_TIMEOUT and verdict.counters.format_errors == 0


def test_lenient_feeds_a_rejected_turn_back_and_counts_the_opening_streak() -> None:
    first = judge_reply(Reply("no xml"), Counters(), LENIENT, out_of_time=False)
    assert first.end is None and first.run is None and "response" in (first.feedback or "")
    assert (first.counters.format_errors, first.counters.opening_streak) == (1, 1)
    second = judge_reply(Reply(GOOD), first.counters, LENIENT, out_of_time=False)
    assert second.run is not None and second.counters.opened
    third = judge_reply(Reply("no xml"), second.counters, LENIENT, out_of_time=False)
    assert (third.counters.format_errors, third.counters.opening_streak) == (2, 1)


def test_lenient_a_turn_cut_at_its_limit_with_room_in_the_context_is_fed_back_as_truncated() -> None:
    verdict = judge_reply(Reply("<response><commands>", "length", completion_tokens=48, prompt_tokens=100,
                                max_model_len=4096), Counters(), LENIENT, out_of_time=False)  # fmt: skip
    assert verdict.end is None and verdict.counters.truncated_turns == 1 and "16384" in (verdict.feedback or "")


def test_where_the_conversation_is_summarized_a_reply_that_filled_the_context_is_a_truncated_turn() -> None:
    """As in Terminus 2: the cut reply is salvaged or fed back, and the agent loop summarizes before the next turn."""
    filled = Reply("<response><commands>", "length", completion_tokens=96, prompt_tokens=4000, max_model_len=4096)
    assert judge_reply(filled, Counters(), LENIENT, out_of_time=False).end is EndReason.CONTEXT_LIMIT
    verdict = judge_reply(filled, Counters(), SUMMARIZING, out_of_time=False)
    assert verdict.end is None and verdict.counters.truncated_turns == 1 and verdict.feedback is not None
    salvaged = judge_reply(Reply(GOOD + "<response>and more", "length", completion_tokens=96, prompt_tokens=4000,
                                 max_model_len=4096), Counters(), SUMMARIZING, out_of_time=False)  # fmt: skip
    assert salvaged.run is not None and salvaged.counters.truncated_turns == 1


def test_lenient_salvages_a_truncated_turn_up_to_its_response_end() -> None:
    verdict = judge_reply(Reply(GOOD + "<response>and more", finish_reason="length"), Counters(), LENIENT,
                          out_of_time=False)  # fmt: skip
    assert verdict.run is not None and verdict.counters.truncated_turns == 1
    assert any("token limit" in warning for warning in verdict.warnings)
    unsalvageable = judge_reply(Reply("<response><commands>", finish_reason="length"), Counters(), LENIENT,
                                out_of_time=False)  # fmt: skip
    assert unsalvageable.run is None and unsalvageable.feedback and unsalvageable.counters.opened


def test_completion_is_asked_twice_then_ends() -> None:
    first = judge_reply(Reply(DONE), Counters(), STRICT, out_of_time=False)
    asked = judge_after_commands(first.run, first.counters, STRICT, out_of_time=False)
    assert asked.end is None and asked.confirm and asked.counters.awaiting_confirmation
    second = judge_reply(Reply(DONE), asked.counters, STRICT, out_of_time=False)
    done = judge_after_commands(second.run, second.counters, STRICT, out_of_time=False)
    assert done.end is EndReason.TASK_COMPLETE
    unconfirmed = TurnLimits(Strictness(True, True), confirm_completion=False)
    once = judge_reply(Reply(DONE), Counters(), unconfirmed, out_of_time=False)
    assert judge_after_commands(once.run, once.counters, unconfirmed, out_of_time=False).end is EndReason.TASK_COMPLETE


def test_a_plain_turn_between_cancels_the_pending_confirmation() -> None:
    first = judge_reply(Reply(DONE), Counters(), STRICT, out_of_time=False)
    asked = judge_after_commands(first.run, first.counters, STRICT, out_of_time=False)
    plain = judge_reply(Reply(GOOD), asked.counters, STRICT, out_of_time=False)
    after = judge_after_commands(plain.run, plain.counters, STRICT, out_of_time=False)
    assert after.end is None and not after.confirm and not after.counters.awaiting_confirmation


def test_max_turns_bounds_rejected_turns_too() -> None:
    limits = TurnLimits(Strictness(False, False), max_turns=2)
    first = judge_reply(Reply("no xml"), Counters(), limits, out_of_time=False)
    second = judge_reply(Reply("no xml"), first.counters, limits, out_of_time=False)
    assert first.end is None and second.end is EndReason.MAX_TURNS and second.format_error is not None


def test_time_running_out_during_the_commands_ends_the_episode() -> None:
    verdict = judge_reply(Reply(DONE), Counters(), STRICT, out_of_time=False)
    assert judge_after_commands(verdict.run, verdict.counters, STRICT, out_of_time=True).end is EndReason.AGENT_TIMEOUT


@pytest.mark.parametrize("action", [b"<response>", None, 3, ["text"]])
def test_actions_other_than_text_or_reply_are_refused(action) -> None:
    with pytest.raises(TypeError, match="str or a terminus_env.Reply"):
        as_reply(action)


@pytest.mark.parametrize(
    "fields",
    [{"text": None}, {"text": b"x"}, {"text": "x", "finish_reason": None}, {"text": "x", "completion_tokens": -1},
     {"text": "x", "prompt_tokens": 1.5}, {"text": "x", "prompt_tokens": True}, {"text": "x", "max_model_len": -1}],
)  # fmt: skip
def test_a_reply_is_checked_when_made(fields) -> None:
    with pytest.raises(TypeError):
        Reply(**fields)


# ----- whose fault a sandbox failure was ---------------------------------------------------------------------------

SHOWS = {
    SandboxError: Failure.INFRASTRUCTURE, DockerUnavailable: Failure.INFRASTRUCTURE,
    ImageBuildError: Failure.INFRASTRUCTURE, SandboxLost: Failure.INFRASTRUCTURE, AgentCaused: Failure.AGENT_BROKE,
    BrokenByAgent: Failure.AGENT_BROKE, TerminalGone: Failure.TERMINAL_LOST, ResourcesExhausted: Failure.AGENT_LIMIT,
    DiskLimitExceeded: Failure.AGENT_LIMIT,
}  # fmt: skip


def test_every_sandbox_error_says_what_it_shows_and_only_the_agents_are_the_agents() -> None:
    for cls in error_kinds().values():  # those defined elsewhere too (images.py has one)
        shows = next(SHOWS[base] for base in cls.__mro__ if base in SHOWS)
        assert cls.shows is shows, cls
        assert (shows is not Failure.INFRASTRUCTURE) == issubclass(cls, AgentCaused), cls


@pytest.mark.parametrize("limit_broken, lost, shows, expected", [
    (False, False, Failure.INFRASTRUCTURE, Failure.INFRASTRUCTURE),
    (False, False, Failure.TERMINAL_LOST, Failure.TERMINAL_LOST),
    (True, False, Failure.INFRASTRUCTURE, Failure.AGENT_LIMIT),  # the disk watch fired: the lost call is its doing
    (False, True, Failure.INFRASTRUCTURE, Failure.AGENT_LIMIT),  # the daemon died under the agent's memory
    (True, True, Failure.TERMINAL_LOST, Failure.AGENT_LIMIT),
])  # fmt: skip
def test_a_broken_limit_or_a_starved_daemon_outranks_the_error_that_surfaced(limit_broken, lost, shows, expected):
    assert failure_shown(shows, limit_broken=limit_broken, daemon_lost_to_agent=lost) is expected


@pytest.mark.parametrize("running, oom, agents", [
    (True, False, True),  # the daemon died while its container runs: the agent's memory, or state the agent made
    (False, True, True),  # Docker says the OOM killer ended the container
    (False, False, False),  # stopped from outside: Docker, the host, its lifetime
])  # fmt: skip
def test_a_lost_daemon_is_the_agents_unless_its_container_was_stopped_from_outside(running, oom, agents):
    """A traceback in the daemon's stderr once excused the agent ("our bug"); but a bug the agent's state provokes is
    an escape from any 0, and the host cannot tell which: fail closed."""
    assert lost_by_agent(running, oom) is agents


def test_only_what_the_host_shows_was_the_infrastructures_is_masked() -> None:
    for reason in EndReason:
        for grading in (False, True):
            ending = ending_after(Failure.INFRASTRUCTURE, grading=grading, reason=reason)
            # An ending that was already the agent's stays the agent's whatever fails while grading it.
            agents = grading and reason.fault is Fault.AGENT
            assert ending is (reason if agents else EndReason.ENV_ERROR), (reason, grading)
    assert ending_after(Failure.AGENT_LIMIT, grading=True) is EndReason.RESOURCE_LIMIT
    assert ending_after(Failure.AGENT_BROKE, grading=True) is EndReason.VERIFIER_BROKEN
    assert ending_after(Failure.AGENT_BROKE, grading=False) is EndReason.SHELL_LOST
    assert ending_after(Failure.TERMINAL_LOST, grading=True) is EndReason.SHELL_LOST
    assert not any(ending_after(f, grading=g).masked for f in Failure if f is not Failure.INFRASTRUCTURE
                   for g in (False, True))  # fmt: skip
