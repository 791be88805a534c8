"""A rollout as an ATIF trajectory (Agent Trajectory Interchange Format, Harbor's RFC 0001), version 1.7.

Harbor's viewer, its validator, ``atif2otel`` and the leaderboard's submission flow read this format, so an
eval run can be looked at and shared with the ecosystem's tools. The mapping follows what Harbor's own
Terminus 2 agent writes: the first user message is step 1; each model turn is an agent step whose tool calls
are the keystrokes typed (``bash_command``, then ``mark_task_complete`` when the reply says so) and whose
observation is what the model read next (the terminal output, a format error's feedback, or the
confirmation question; on the last turn, the terminal output before grading). One difference: the step's
message is the model's whole reply, not an ``Analysis:``/``Plan:`` digest, so the text matches its token ids.

Pure: a run-file record in, a JSON-ready dict out (``None`` fields left out, as Harbor writes them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from terminus_env import __version__
from terminus_env.protocol import parse_reply, salvage_truncated
from terminus_env.rollout.run_log import RolloutRecord, RunConfig
from terminus_env.rollout.timeline import iso_at

SCHEMA_VERSION = "ATIF-v1.7"
AGENT_NAME = "terminus-env"
KEYSTROKES_TOOL = "bash_command"
COMPLETE_TOOL = "mark_task_complete"
_MODEL_POLICY = "model:"


@dataclass(frozen=True)
class AgentSpec:
    """Who played the rollouts: this package speaking Terminus 2, with the run's policy and options."""

    model_name: str | None
    options: dict[str, Any] = field(default_factory=dict)
    name: str = AGENT_NAME
    version: str = __version__


def agent_spec(config: RunConfig) -> AgentSpec:
    """The agent of a run, from the options its run file records."""
    model = config.policy[len(_MODEL_POLICY) :] if config.policy.startswith(_MODEL_POLICY) else None
    options = {
        "protocol": "terminus-2-xml",
        "policy": config.policy,
        "strict": config.strict,
        "max_turns": config.max_turns,
        "max_turn_tokens": config.max_turn_tokens,
    }
    return AgentSpec(model_name=model, options=options)


def atif_trajectory(record: RolloutRecord, agent: AgentSpec) -> dict[str, Any] | None:
    """The ATIF document of one rollout; None when the rollout never reached its first observation."""
    trajectory = record.trajectory or {}
    messages: Sequence[Mapping[str, str]] = trajectory.get("messages") or []
    if not messages:
        return None
    turns: Sequence[Mapping[str, Any]] = trajectory.get("turns") or []
    steps = [_drop_none({
        "step_id": 1,
        "timestamp": iso_at(trajectory, trajectory.get("ready_s")),
        "source": "user",
        "message": messages[0].get("content", ""),
    })]  # fmt: skip
    for index, turn in enumerate(turns):
        following = messages[2 * index + 2] if 2 * index + 2 < len(messages) else None
        steps.append(_agent_step(trajectory, index + 1, turn, following))
    return _drop_none({
        "schema_version": SCHEMA_VERSION,
        "session_id": trajectory.get("rollout_id"),
        "agent": _drop_none({
            "name": agent.name, "version": agent.version, "model_name": agent.model_name, "extra": agent.options,
        }),
        "steps": steps,
        "final_metrics": _drop_none({
            "total_prompt_tokens": token_total(turns, "prompt_tokens"),
            "total_completion_tokens": token_total(turns, "completion_tokens"),
            "total_steps": len(steps),
        }),
        "extra": {"task": record.task, "trial": record.trial, "reward": record.reward, "end_reason": record.end_reason},
    })  # fmt: skip


def keystroke_calls(step: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The keystrokes tool calls of an ATIF step (ours or Harbor's Terminus 2)."""
    return [call for call in step.get("tool_calls") or [] if call.get("function_name") == KEYSTROKES_TOOL]


def _agent_step(
    trajectory: Mapping[str, Any], turn_number: int, turn: Mapping[str, Any], following: Mapping[str, str] | None
) -> dict[str, Any]:
    commands = turn.get("commands") or []
    calls = [
        {
            "tool_call_id": f"call_{turn_number}_{i}",
            "function_name": KEYSTROKES_TOOL,
            "arguments": {"keystrokes": command["keystrokes"], "duration": command["duration"]},
        }
        for i, command in enumerate(commands, 1)
    ]  # fmt: skip
    ran = turn.get("terminal") is not None
    if ran and _marks_complete(turn):
        calls.append({"tool_call_id": f"call_{turn_number}_task_complete", "function_name": COMPLETE_TOOL,
                      "arguments": {}})  # fmt: skip
    observed = following.get("content") if following is not None else (turn.get("terminal") or {}).get("text")
    # Several commands share one terminal output, so only a single command's observation names its call.
    source = calls[0]["tool_call_id"] if len(commands) == 1 else None
    result = _drop_none({"source_call_id": source, "content": observed})
    return _drop_none({
        "step_id": turn_number + 1,
        "timestamp": iso_at(trajectory, turn.get("replied_s")),
        "source": "agent",
        "message": turn.get("reply", ""),
        "tool_calls": calls or None,
        "observation": {"results": [result]} if observed is not None else None,
        "metrics": _drop_none({
            "prompt_tokens": turn.get("prompt_tokens"),
            "completion_tokens": turn.get("completion_tokens"),
            "prompt_token_ids": turn.get("prompt_token_ids"),
            "completion_token_ids": turn.get("token_ids"),
            "logprobs": turn.get("logprobs"),
        }) or None,
        "extra": _drop_none({
            "finish_reason": turn.get("finish_reason"),
            "format_error": turn.get("format_error"),
            "warnings": turn.get("warnings") or None,
            "replica": turn.get("replica"),
            "sampling": turn.get("sampling") or None,
            "policy_version": turn.get("policy_version"),
        }) or None,
    })  # fmt: skip


def _marks_complete(turn: Mapping[str, Any]) -> bool:
    """Whether an executed reply said the task is complete (a reply cut at the token limit ran as salvaged)."""
    text = turn.get("reply", "")
    if turn.get("finish_reason") == "length":
        text = salvage_truncated(text) or text
    return parse_reply(text).task_complete


def token_total(turns: Sequence[Mapping[str, Any]], key: str) -> int | None:
    """The sum of a per-turn token count, or None when no turn reported it."""
    values = [turn[key] for turn in turns if turn.get(key) is not None]
    return sum(values) if values else None


def _drop_none(entry: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in entry.items() if value is not None}
