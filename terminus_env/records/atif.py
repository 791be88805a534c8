"""A rollout as an ATIF trajectory (Agent Trajectory Interchange Format, Harbor's RFC 0001), version 1.7.

Harbor's viewer, its validator, ``atif2otel`` and the leaderboard's submission flow read this format, so an
eval run can be looked at and shared with the ecosystem's tools. The mapping follows what Harbor's own
Terminus 2 agent writes: the first user message is step 1; each model turn is an agent step whose tool calls
are the keystrokes typed (``bash_command``, then ``mark_task_complete`` when the reply says so) and whose
observation is what the model read next (the terminal output, a format error's feedback, or the
confirmation question; on the last turn, the terminal output before grading). One difference: the step's
message is the model's whole reply, not an ``Analysis:``/``Plan:`` digest, so the text matches its token ids.

A context summarization is recorded as Terminus 2 records it: a ``system`` step whose observation references the
subagents' own trajectories (``trajectory.summarization-N-summary.json``, ``-questions``, ``-answers``: each the
messages that request saw, marked as copied context, then its prompt and the model's answer), then a ``user`` step
with the message the model answered next.

Pure: a run-file record in, a JSON-ready dict out (``None`` fields left out, as Harbor writes them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from terminus_env import __version__
from terminus_env.protocol import parse_reply, salvage_truncated
from terminus_env.records.run_log import RolloutRecord, RunConfig
from terminus_env.records.timeline import iso_at

SCHEMA_VERSION = "ATIF-v1.7"
AGENT_NAME = "terminus-env"
KEYSTROKES_TOOL = "bash_command"
COMPLETE_TOOL = "mark_task_complete"
SUMMARIZED = "The conversation neared the model's context: it was summarized, and a new one carries on."
_MODEL_POLICY = "model:"
_ROLE_SOURCE = {"user": "user", "assistant": "agent", "system": "system"}


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
        "strict_format": config.strict_format,
        "strict_truncation": config.strict_truncation,
        "max_turns": config.max_turns,
        "max_turn_tokens": config.max_turn_tokens,
        "sampling": dict(config.sampling),
        "enable_summarize": config.summarize,
        "proactive_summarization_threshold": config.summarize_threshold,
        "context_window": config.context_window,
    }
    return AgentSpec(model_name=model, options=options)


def atif_trajectory(record: RolloutRecord, agent: AgentSpec) -> dict[str, Any] | None:
    """The ATIF document of one rollout; None when the rollout never reached its first observation."""
    trajectory = record.trajectory or {}
    segments = conversations(trajectory)
    if not segments[0][0]:
        return None
    turns: Sequence[Mapping[str, Any]] = trajectory.get("turns") or []
    done = {c["turn"]: (n, c) for n, c in summarizations(trajectory)}
    steps = [_drop_none({
        "step_id": 1,
        "timestamp": iso_at(trajectory, trajectory.get("ready_s")),
        "source": "user",
        "message": segments[0][0][0].get("content", ""),
    })]  # fmt: skip
    for index, turn in enumerate(turns):
        if index in done:
            number, compaction = done[index]
            steps += _summarization_steps(trajectory, number, compaction, len(steps))
        steps.append(_agent_step(trajectory, len(steps) + 1, index + 1, turn, observation_after(segments, index)))
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


def summarizations(trajectory: Mapping[str, Any]) -> list[tuple[int, Mapping[str, Any]]]:
    """The summarizations that replaced the conversation, numbered from 1 as Terminus 2 numbers its files."""
    done = [c for c in trajectory.get("compactions") or [] if c.get("outcome") != "failed"]
    return list(enumerate(done, 1))


def conversations(trajectory: Mapping[str, Any]) -> list[tuple[Sequence[Mapping[str, str]], int, int]]:
    """The rollout's conversations in order, each ``(messages, first turn, messages before that turn's reply)``:
    the first starts with the task's message; each summarization starts another with its seed."""
    done = [c for _, c in summarizations(trajectory)]
    whole = [c.get("replaced") or [] for c in done] + [trajectory.get("messages") or []]
    starts = [(0, 1)] + [(c["turn"], len(c.get("seed") or [])) for c in done]
    return [(messages, turn, seed) for messages, (turn, seed) in zip(whole, starts, strict=True)]


def observation_after(segments: Sequence[tuple[Sequence[Mapping[str, str]], int, int]], index: int) -> str | None:
    """What the model read after turn ``index`` (0-based): the next message of its conversation, if there is one."""
    messages, first, seed = next(s for s in reversed(segments) if s[1] <= index)
    position = seed + 2 * (index - first) + 1
    return messages[position].get("content") if position < len(messages) else None


def subagent_trajectories(record: RolloutRecord, agent: AgentSpec) -> dict[str, dict[str, Any]]:
    """The summarization requests' own ATIF documents, by file name (beside ``trajectory.json``)."""
    trajectory = record.trajectory or {}
    out: dict[str, dict[str, Any]] = {}
    for number, compaction in summarizations(trajectory):
        for call in compaction.get("calls") or []:
            name, document = _subagent(trajectory, agent, number, compaction, call)
            out[name] = document
    return out


def _summarization_steps(
    trajectory: Mapping[str, Any], number: int, compaction: Mapping[str, Any], before: int
) -> list[dict[str, Any]]:
    """The system step that references the requests' trajectories, and the message the model answered next."""
    refs = [
        {"session_id": _subagent_session(trajectory, number, call["role"]),
         "trajectory_path": subagent_file(number, call["role"]),
         "extra": {"summary": f"Context summarization {number}: the {call['role']} request"}}
        for call in compaction.get("calls") or []
    ]  # fmt: skip
    extra = {"context_management": {"type": "compaction", "boundary": "replace"}, "trigger": compaction["trigger"],
             "outcome": compaction["outcome"], "free_tokens": compaction.get("free_tokens")}  # fmt: skip
    when = iso_at(trajectory, compaction.get("at_s"))
    seed = compaction.get("seed") or []
    return [
        _drop_none({"step_id": before + 1, "timestamp": when, "source": "system", "message": SUMMARIZED,
                    "observation": {"results": [{"subagent_trajectory_ref": refs}]} if refs else None,
                    "extra": _drop_none(extra)}),
        _drop_none({"step_id": before + 2, "timestamp": when, "source": "user",
                    "message": seed[-1].get("content", "") if seed else ""}),
    ]  # fmt: skip


def subagent_file(number: int, role: str) -> str:
    return f"trajectory.summarization-{number}-{role}.json"


def _subagent_session(trajectory: Mapping[str, Any], number: int, role: str) -> str:
    return f"{trajectory.get('rollout_id')}-summarization-{number}-{role}"


def _subagent(
    trajectory: Mapping[str, Any], agent: AgentSpec, number: int, compaction: Mapping[str, Any],
    call: Mapping[str, Any],
) -> tuple[str, dict[str, Any]]:  # fmt: skip
    """One request's document: the messages it saw (copied context), its prompt, the model's answer."""
    role = call["role"]
    history = list((compaction.get("replaced") or [])[: compaction.get("kept", 0)])
    if role == "answers":
        summary = next(c for c in compaction["calls"] if c["role"] == "summary")
        history += [{"role": "user", "content": summary["prompt"]}, {"role": "assistant", "content": summary["reply"]}]
    elif role != "summary":
        history = []
    steps = [{"step_id": i, "source": _ROLE_SOURCE.get(m.get("role", "user"), "user"), "message": m.get("content", ""),
              "is_copied_context": True} for i, m in enumerate(history, 1)]  # fmt: skip
    when = iso_at(trajectory, call.get("replied_s"))
    steps.append(_drop_none({"step_id": len(steps) + 1, "timestamp": when, "source": "user",
                             "message": call["prompt"]}))  # fmt: skip
    steps.append(_drop_none({
        "step_id": len(steps) + 1, "timestamp": when, "source": "agent", "message": call.get("reply", ""),
        "metrics": _metrics(call) or None,
        "extra": _drop_none({"finish_reason": call.get("finish_reason"), "replica": call.get("replica"),
                             "sampling": call.get("sampling") or None,
                             "policy_version": call.get("policy_version")}) or None,
    }))  # fmt: skip
    document = _drop_none({
        "schema_version": SCHEMA_VERSION,
        "session_id": _subagent_session(trajectory, number, role),
        "agent": _drop_none({"name": f"{agent.name}-summarization-{role}", "version": agent.version,
                             "model_name": agent.model_name,
                             "extra": {"parent_session_id": trajectory.get("rollout_id"),
                                       "summarization_index": number}}),
        "steps": steps,
        "final_metrics": _drop_none({"total_prompt_tokens": call.get("prompt_tokens"),
                                     "total_completion_tokens": call.get("completion_tokens"),
                                     "total_steps": len(steps)}),
    })  # fmt: skip
    return subagent_file(number, role), document


def keystroke_calls(step: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The keystrokes tool calls of an ATIF step (ours or Harbor's Terminus 2)."""
    return [call for call in step.get("tool_calls") or [] if call.get("function_name") == KEYSTROKES_TOOL]


def _agent_step(
    trajectory: Mapping[str, Any], step_id: int, turn_number: int, turn: Mapping[str, Any], following: str | None
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
    observed = following if following is not None else (turn.get("terminal") or {}).get("text")
    # Several commands share one terminal output, so only a single command's observation names its call.
    source = calls[0]["tool_call_id"] if len(commands) == 1 else None
    result = _drop_none({"source_call_id": source, "content": observed})
    return _drop_none({
        "step_id": step_id,
        "timestamp": iso_at(trajectory, turn.get("replied_s")),
        "source": "agent",
        "message": turn.get("reply", ""),
        "tool_calls": calls or None,
        "observation": {"results": [result]} if observed is not None else None,
        "metrics": _metrics(turn) or None,
        "extra": _drop_none({
            "finish_reason": turn.get("finish_reason"),
            "format_error": turn.get("format_error"),
            "warnings": turn.get("warnings") or None,
            "replica": turn.get("replica"),
            "sampling": turn.get("sampling") or None,
            "policy_version": turn.get("policy_version"),
        }) or None,
    })  # fmt: skip


def _metrics(turn: Mapping[str, Any]) -> dict[str, Any]:
    return _drop_none({
        "prompt_tokens": turn.get("prompt_tokens"),
        "completion_tokens": turn.get("completion_tokens"),
        "prompt_token_ids": turn.get("prompt_token_ids"),
        "completion_token_ids": turn.get("token_ids"),
        "logprobs": turn.get("logprobs"),
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
