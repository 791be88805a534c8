"""Where the simulated model's words come from: a :class:`ReplySource` maps a conversation to a reply.

The default answers in the Terminus format with a harmless command, so an agent loop runs end to
end; scripted replies come from a JSON-lines file; an oracle agent plugs in as ``module:callable``.
"""

from __future__ import annotations

import importlib
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from terminus_env.serving.client import message_text


class ReplySource(Protocol):
    def __call__(self, messages: list[dict]) -> str: ...


DEFAULT_REPLY = """<response>
<analysis>Simulated model: nothing is known about the task yet.</analysis>
<plan>Print the working directory and list it.</plan>
<commands>
<keystrokes duration="0.1">pwd; ls
</keystrokes>
</commands>
</response>"""


def default_reply(messages: list[dict]) -> str:
    return DEFAULT_REPLY


class ScriptedReplies:
    """Replies from a JSON-lines file.

    A line ``{"reply": "..."}`` joins the cycle: such replies are handed out in turn, over and over.
    A line ``{"match": "text", "replies": ["turn 1", "turn 2", ...]}`` (or a single ``"reply"``) is
    keyed: when ``text`` occurs in the conversation's first user message, turn *n* gets the *n*-th
    reply (the last one repeats). Keyed lines are tried in file order before the cycle.
    """

    def __init__(self, keyed: list[tuple[str, list[str]]], cycle: list[str]) -> None:
        if not keyed and not cycle:
            raise ValueError("scripted replies: the file holds no reply")
        self._keyed = keyed
        self._cycle: Iterator[str] | None = itertools.cycle(cycle) if cycle else None

    @classmethod
    def from_file(cls, path: str | Path) -> ScriptedReplies:
        keyed: list[tuple[str, list[str]]] = []
        cycle: list[str] = []
        try:
            lines = Path(path).read_text().splitlines()
        except OSError as exc:
            raise ValueError(f"scripted replies: cannot read {path}: {exc.strerror}") from exc
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                replies = entry["replies"] if "replies" in entry else [entry["reply"]]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise ValueError(
                    f'{path}:{number}: expected {{"reply": ...}} or {{"match": ..., "replies": [...]}} ({exc})'
                ) from exc
            if not replies or not all(isinstance(r, str) for r in replies):
                raise ValueError(f"{path}:{number}: replies must be a non-empty list of strings")
            if "match" in entry:
                keyed.append((str(entry["match"]), replies))
            else:
                cycle.extend(replies)
        return cls(keyed, cycle)

    def __call__(self, messages: list[dict]) -> str:
        first_user = next((message_text(m) for m in messages if m.get("role") == "user"), "")
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        for match, replies in self._keyed:
            if match in first_user:
                return replies[min(turn, len(replies) - 1)]
        if self._cycle is None:
            raise LookupError("scripted replies: no keyed reply matches this conversation and no line cycles")
        return next(self._cycle)


def load_reply_source(spec: str) -> ReplySource:
    """``package.module:callable`` -> that callable (an oracle agent, say)."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"reply source {spec!r}: expected module:callable")
    try:
        source = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"reply source {spec!r}: cannot import it ({exc})") from exc
    if not callable(source):
        raise ValueError(f"reply source {spec!r} is not callable")
    return source
