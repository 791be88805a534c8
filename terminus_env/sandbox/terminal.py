"""The tmux terminal of a sandbox: typing keys, waiting only as long as a command runs, reading output.

Every operation is one request on the sandbox's control channel; the wait for the shell to be
idle runs inside the container (see inside/terminal.py), so it ends within milliseconds of the prompt
coming back instead of after the full duration. The terminal lives on the agent's side: when it
stops working, that is what the agent did to it (TerminalGone), never a fault of the host; except while it starts,
before the agent exists, when a shell that dies is the image's or the host's fault (SandboxError).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from terminus_env.sandbox.channel import Channel
from terminus_env.sandbox.errors import AgentCaused, SandboxError, TerminalGone
from terminus_env.utils.output_cap import OUTPUT_LIMIT_BYTES, cap_text

WIDTH, HEIGHT = 160, 40
HISTORY_LINES = 100_000
MAX_WAIT_S = 60.0
MAX_TURN_WAIT_S = 3600.0  # what one turn's commands may wait in all, however many there are
SETTLE_PAUSE_S = 0.05
"""Between looks at output still scrolling after the shell seemed idle (a loop of shell builtins keeps the shell its
own foreground job, so the idle check cannot see it run)."""
CHUNK_BYTES = 8_000  # tmux send-keys silently drops arguments much longer than 16 KB
TMUX = ["tmux", "-L", "terminus", "-f", "/dev/null"]
TARGET = "main"
_NAMED_KEYS = (
    "Enter|Escape|Tab|BTab|BSpace|Space|Up|Down|Left|Right|Home|End|IC|DC|Insert|Delete|"
    "PageUp|PageDown|PgUp|PgDn|PPage|NPage|F1[0-2]|F[1-9]|KPEnter"
)
_KEY_NAME = re.compile(rf"(?:[CMS]-)*(?:{_NAMED_KEYS})|(?:[CMS]-)+[\x21-\x7e]")
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass
class TerminalOutput:
    text: str
    is_screen: bool  # True: no new output could be found (e.g. after `clear`), so this is the current screen
    omitted_bytes: int


@dataclass(frozen=True)
class TerminalStep:
    """A turn's commands, typed and waited for: the seconds each waited (the ones the budget left out are not
    there), and what is new on the terminal afterwards."""

    waited: tuple[float, ...]
    output: TerminalOutput


class Terminal:
    """A 160x40 tmux pane running ``bash --login``; create it with ``Terminal.start``."""

    def __init__(self, channel: Channel, pane_pid: int, pane_tty: str, user: str | None) -> None:
        self._channel = channel
        self._pane_pid = pane_pid
        self._pane_tty = pane_tty
        self._user = user
        self._anchor: tuple[int, str] | None = None  # (absolute line, its text) at the last capture
        self._history: int | None = None  # the pane's history size at the last capture

    @classmethod
    async def start(cls, channel: Channel, *, user: str | None, workdir: str | None) -> Terminal:
        argv = [
            *TMUX, "start-server", ";",
            "set-option", "-g", "default-terminal", "xterm-256color", ";",
            "set-option", "-g", "history-limit", str(HISTORY_LINES), ";",
            "set-option", "-g", "status", "off", ";",
            "new-session", "-d", "-s", TARGET, "-x", str(WIDTH), "-y", str(HEIGHT),
            *(["-c", workdir] if workdir else []), "-P", "-F", "#{pane_pid} #{pane_tty}", "bash", "--login",
        ]  # fmt: skip
        try:
            reply = await channel.request("tmux", 30, argv=argv, user=user)
        except AgentCaused as exc:  # nothing of the agent's has run yet: the image lacks what the terminal needs
            raise SandboxError(f"cannot start tmux in the sandbox ({exc}); the image needs tmux and bash") from exc
        if reply["rc"] != 0:
            detail = reply["err"].strip()
            raise SandboxError(f"cannot start tmux in the sandbox ({detail}); the image needs tmux and bash")
        pane_pid, pane_tty = reply["out"].split()
        terminal = cls(channel, int(pane_pid), pane_tty, user)
        try:
            await terminal.send("", 10)  # wait for the login shell's first prompt
        except AgentCaused as exc:  # the shell died before the agent existed: the image's or the host's doing
            raise SandboxError(
                f"the terminal's login shell ended as it started ({exc}); look at the image's /etc/profile and the "
                "user's ~/.bash_profile (`bash --login` must keep running), or start the sandbox again"
            ) from exc
        return terminal

    async def send(self, keystrokes: str, duration: float) -> float:
        """Type ``keystrokes``, then wait up to min(duration, 60) s, less once the shell is idle.

        Returns the seconds waited.
        """
        timeout = min(max(float(duration), 0.0), MAX_WAIT_S)
        started = time.monotonic()
        reply = await self._request(
            "send", timeout + 30, tmux=TMUX, target=TARGET, calls=_calls(keystrokes), timeout=timeout, **self._pane()
        )
        if reply.get("error"):
            raise TerminalGone(f"the terminal stopped taking keys ({reply['error']}); close this sandbox")
        return time.monotonic() - started

    async def step(self, commands: Sequence[tuple[str, float]], budget: float | None = None) -> TerminalStep:
        """A whole turn in one request: type each command's keys and wait (as ``send``) in turn, starting none once
        ``budget`` seconds (the agent's time left; None: no limit) are spent; then what is new (as
        ``capture_new``). Output still scrolling once the shell looked idle is looked at again, within the turn's
        wait, until it stops."""
        timeouts = [min(max(float(duration), 0.0), MAX_WAIT_S) for _, duration in commands]
        batch = [{"calls": _calls(keys), "timeout": timeout} for (keys, _), timeout in zip(commands, timeouts)]
        wait = sum(timeouts)
        wait = min(wait if budget is None else min(wait, budget), MAX_TURN_WAIT_S)
        started = time.monotonic()
        reply = await self._request("step", wait + 30, commands=batch, budget=budget, **self._pane(), **self._where())
        if reply.get("error"):
            raise TerminalGone(f"the terminal stopped taking keys ({reply['error']}); close this sandbox")
        waited = tuple(reply["waited"])
        deadline = started + wait  # the turn's commands may wait this long in all, as Terminus 2 always waits
        while reply.get("moving") and time.monotonic() < deadline:
            await asyncio.sleep(SETTLE_PAUSE_S)
            reply = await self._request("capture", 30, screen=True, **self._where())
        return TerminalStep(waited, await self._read(reply))

    async def capture_new(self) -> TerminalOutput:
        """Output since the last capture, or the current screen when none can be found."""
        return await self._read(await self._request("capture", 30, **self._where()))

    async def _read(self, reply: dict[str, Any]) -> TerminalOutput:
        """What a capture answered: the lines after the anchor, or the screen (asked for when not sent along)."""
        if reply.get("moving"):  # output kept scrolling while we looked: show the screen, re-anchor next time
            self._anchor = None
            return await self._screen_output(reply.get("screen"))
        lines = reply["text"].rstrip("\n").split("\n")
        history, cursor = reply["history"], reply["cursor"]
        self._history = history
        previous = self._anchor
        self._anchor = (history + cursor, _line(lines, cursor - reply["start"]).rstrip())
        if previous is None or _blank_after(lines, previous[1]):
            return await self._screen_output(reply.get("screen"))
        # A full history drops its oldest tenth, which shifts line numbers: when the anchor is not where
        # it was, it scrolled out, so all that is left is new. Otherwise (e.g. after `clear`) show the screen.
        if not lines[0].startswith(previous[1]) and history < HISTORY_LINES * 9 // 10:
            return await self._screen_output(reply.get("screen"))
        text, omitted = cap_text("\n".join(lines).rstrip(), OUTPUT_LIMIT_BYTES)
        return TerminalOutput(text, False, omitted)

    async def screen(self) -> str:
        """The visible 160x40 screen now."""
        command = ["capture-pane", "-p", "-t", TARGET]
        reply = await self._request("commands", 30, tmux=TMUX, target=TARGET, commands=[command])
        return reply["out"].rstrip()

    async def _screen_output(self, screen: str | None = None) -> TerminalOutput:
        text, omitted = cap_text(await self.screen() if screen is None else screen.rstrip(), OUTPUT_LIMIT_BYTES)
        return TerminalOutput(text, True, omitted)

    def _pane(self) -> dict[str, Any]:
        return {"pane_pid": self._pane_pid, "pane_tty": self._pane_tty}

    def _where(self) -> dict[str, Any]:
        return {"tmux": TMUX, "target": TARGET, "anchor": self._anchor[0] if self._anchor else None,
                "history": self._history}  # fmt: skip

    async def _request(self, op: str, wait_s: float, **fields: Any) -> dict[str, Any]:
        reply = await self._channel.request(op, wait_s, user=self._user, **fields)
        if reply.get("gone") or reply.get("rc", 0) != 0:
            raise TerminalGone(
                "the shell in the terminal exited (e.g. after `exit`) or its tmux server died; "
                "close this sandbox and start a new one"
            )
        return reply


def _calls(keystrokes: str) -> list[list[str]]:
    """The tmux commands that type ``keystrokes`` into the pane."""
    return [["send-keys", "-t", TARGET, *args] for args in key_arguments(keystrokes)]


def key_arguments(keystrokes: str) -> list[list[str]]:
    """tmux send-keys arguments: an exact key name as that key; anything else typed literally, in chunks."""
    if _KEY_NAME.fullmatch(keystrokes):
        return [[keystrokes]]
    text = _SURROGATE.sub("\ufffd", keystrokes)  # invalid UTF-8 arrives as lone surrogates
    calls: list[list[str]] = []
    for index, part in enumerate(text.split("\0")):
        if index:
            calls.append(["C-@"])  # the key that types NUL
        calls.extend(["-l", "--", chunk] for chunk in _chunks(part, CHUNK_BYTES))
    return calls


def _chunks(text: str, limit: int) -> list[str]:
    chunks: list[str] = []
    current: list[str] = []
    size = 0
    for char in text:
        width = len(char.encode("utf-8"))
        if size + width > limit:
            chunks.append("".join(current))
            current, size = [], 0
        current.append(char)
        size += width
    if current:
        chunks.append("".join(current))
    return chunks


def _line(lines: list[str], index: int) -> str:
    return lines[index] if 0 <= index < len(lines) else ""


def _blank_after(lines: list[str], anchor_text: str) -> bool:
    """Nothing new: the only captured line is the unchanged anchor."""
    return len([line for line in lines if line.strip()]) <= 1 and lines[0].rstrip() == anchor_text
