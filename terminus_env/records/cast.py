"""A rollout's terminal as an asciinema v2 recording (``recording.cast``), from what the rollout recorded.

What it holds: the screen of the first observation at time 0; then, per turn, a marker (``turn N``) and the
turn's keystroke commands as input events when the reply arrived, and the terminal's new output (or its whole
screen, when no new part could be isolated) when the env had read it after the turn's last command. It is not a
byte stream of the pty: the terminal is read once per turn, so output that scrolled by during a turn appears at
once, at the end of the turn, and the moments between a turn's commands are not recorded (the env keeps wall-clock
times out of ``info``). Replayed, it shows what the model saw, when it saw it.

Pure: a trajectory (as the run file holds it) in, the file's text out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from terminus_env.records.timeline import instant
from terminus_env.sandbox.terminal import HEIGHT, WIDTH

_CLEAR_SCREEN = "\x1b[H\x1b[2J"
_CLEAR_LINE = "\r\x1b[K"  # new output starts with the prompt line already on screen: rewrite it whole


def asciinema_cast(trajectory: Mapping[str, Any], title: str) -> str | None:
    """The recording, or None when the rollout recorded no times or no first screen (old run files, or a
    sandbox that never started)."""
    ready_s, screen = trajectory.get("ready_s"), trajectory.get("screen")
    start = instant(trajectory, ready_s)
    if start is None or screen is None:
        return None
    header = {
        "version": 2, "width": WIDTH, "height": HEIGHT, "timestamp": int(start), "title": title,
        "env": {"TERM": "xterm-256color", "SHELL": "/bin/bash"},
    }  # fmt: skip
    events: list[tuple[float, str, str]] = [(0.0, "o", _CLEAR_SCREEN + _crlf(screen))]
    clock = 0.0
    turns = trajectory.get("turns") or []
    for number, turn in enumerate(turns, 1):
        replied, observed = turn.get("replied_s"), turn.get("observed_s")
        if replied is None or observed is None:
            continue
        clock = max(clock, replied - ready_s)
        events.append((clock, "m", f"turn {number}"))
        events += [(clock, "i", command["keystrokes"]) for command in turn.get("commands") or []]
        terminal = turn.get("terminal")
        if terminal is not None:
            grading = (trajectory.get("grade_s") or 0.0) if number == len(turns) else 0.0  # read before grading
            clock = max(clock, observed - grading - ready_s)
            prefix = _CLEAR_SCREEN if terminal.get("is_screen") else _CLEAR_LINE
            events.append((clock, "o", prefix + _crlf(terminal.get("text", ""))))
    lines = [json.dumps(header)] + [json.dumps([round(t, 3), kind, data]) for t, kind, data in events]
    return "\n".join(lines) + "\n"


def _crlf(text: str) -> str:
    """A terminal needs a carriage return with each line feed to start the next line at column 0."""
    return text.replace("\r\n", "\n").replace("\n", "\r\n")
