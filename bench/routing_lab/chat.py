"""The workload as chat: what an HTTP client sends and what the simulated replicas answer, turn by turn.

A :class:`RolloutPlan` speaks in token ids; over HTTP a rollout is a conversation. Plan token ``t``
becomes the word ``w<t>``, which the simulator's tokenizer maps to one token, so lengths survive.
The system prompt is shared by every rollout and the task prompt by a group, so prefix reuse
survives too; each rollout's first user message ends with a marker by which the replicas' scripted
replies (``--replies``) find its answers. :func:`twin_plans` gives back, for the virtual-time
cluster, the plans whose prompts and outputs are the HTTP run's tokens exactly, so the two runs can
be compared number for number.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from routing_lab.workload import RolloutPlan, TurnPlan
from terminus_env.serving.sim.tokenizer import IM_END, IM_START, encode, encode_chat, token_id


@dataclass(frozen=True)
class ChatTurn:
    reply: str  # the model's answer; its tokens and the end-of-turn token are the turn's output
    tool: str  # what the tool prints, sent back as the next user message ("" after the last turn)
    tool_wait_s: float  # simulated seconds between the answer and the next request


@dataclass(frozen=True)
class ChatRollout:
    rollout_id: str
    group_id: str
    step: int
    system: str
    task: str
    turns: tuple[ChatTurn, ...]
    max_tokens: int

    def first_messages(self) -> list[dict]:
        return [{"role": "system", "content": self.system}, {"role": "user", "content": self.task}]


def _words(tokens: Sequence[int], vocabulary: Sequence[str] | None) -> str:
    if vocabulary:
        return " ".join(vocabulary[t % len(vocabulary)] for t in tokens)
    return " ".join(f"w{t}" for t in tokens)


def _reply(output_len: int, vocabulary: Sequence[str] | None) -> str:
    """An answer of ``output_len - 1`` words: with the end-of-turn token, ``output_len`` generated tokens."""
    if vocabulary:  # each word after a space: one token, as a model restricted to these words writes them
        return "".join(" " + vocabulary[(31 * i) % len(vocabulary)] for i in range(1, output_len))
    return " ".join(f"r{i}" for i in range(1, output_len))


def marker(rollout_id: str) -> str:
    """The end of a rollout's first user message; the trailing dot keeps ``g1.`` from matching ``g10.``."""
    return f"rollout-{rollout_id}."


def chat_rollouts(batches: Sequence[Sequence[RolloutPlan]], system_tokens: int,
                  vocabulary: Sequence[str] | None = None) -> list[list[ChatRollout]]:
    """Each plan as a conversation: its first ``system_tokens`` prompt tokens are the system message.

    Plan token ``t`` is the word ``w<t>`` (one token for the simulator's own tokenizer), or, with
    ``vocabulary``, the word ``vocabulary[t % len(vocabulary)]``: words that are one token each for a real
    model's tokenizer (``routing_lab.engines.one_token_words``), so lengths and shared prefixes survive there.
    """
    out = []
    for batch in batches:
        step = []
        for plan in batch:
            system, task = plan.prompt[:system_tokens], plan.prompt[system_tokens:]
            turns = tuple(
                ChatTurn(_reply(turn.output_len, vocabulary), _words(turn.tool_tokens, vocabulary), turn.tool_wait_s)
                for turn in plan.turns
            )
            step.append(ChatRollout(plan.rollout_id, plan.group_id, plan.step, _words(system, vocabulary),
                                    f"{_words(task, vocabulary)} {marker(plan.rollout_id)}", turns,
                                    plan.max_tokens))
        out.append(step)
    return out


def write_replies(rollouts: Sequence[Sequence[ChatRollout]], path: Path) -> Path:
    """The replicas' ``--replies`` file: each rollout's answers, keyed by its marker."""
    with path.open("w") as out:
        for batch in rollouts:
            for ro in batch:
                out.write(json.dumps({"match": marker(ro.rollout_id), "replies": [t.reply for t in ro.turns]}) + "\n")
    return path


def twin_plans(rollouts: Sequence[Sequence[ChatRollout]]) -> list[list[RolloutPlan]]:
    """Plans whose token streams are exactly what the HTTP run sends and receives (turns cut by
    ``max_tokens`` aside: over HTTP their end-of-turn token is added back by the chat template)."""
    assistant, user = token_id("assistant"), token_id("user")
    out = []
    for batch in rollouts:
        step = []
        for ro in batch:
            turns = []
            for turn in ro.turns:
                output = (*encode(turn.reply), IM_END)
                tool = (IM_START, user, *encode(turn.tool), IM_END, IM_START, assistant) if turn.tool else ()
                turns.append(TurnPlan(len(output), tool, turn.tool_wait_s, output))
            prompt = tuple(encode_chat(ro.first_messages()))
            step.append(RolloutPlan(ro.rollout_id, ro.group_id, ro.step, prompt, tuple(turns), ro.max_tokens))
        out.append(step)
    return out
