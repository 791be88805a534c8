"""A real headless Chromium for the page tests, driven over the DevTools protocol on a pipe.

``--remote-debugging-pipe`` makes Chromium read protocol commands from its fd 3 and write replies and events
to its fd 4, as NUL-terminated JSON: no port, no WebSocket library. The tests load a page, read what it shows
(``document.body.innerText`` holds only rendered text: a closed ``<details>`` or a hidden element is not in
it) and save a screenshot of the whole page.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from require import REQUIRE_BROWSER

from terminus_env.config import env_flag
from terminus_env.utils.process_group import end_group

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"
"""What the browser tests leave for a person to look at (screenshots), outside the temporary folders."""
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
WIDTH = 1280
CLOSE_WAIT_S = 30.0  # for Chromium to close when asked (it flushes its profile first)
KILL_WAIT_S = 30.0  # for every process it started to be gone once killed


def chromium_path() -> str:
    """Debian's chromium; a missing one skips the test, or fails it under TERMINUS_REQUIRE_BROWSER=1 (CI)."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path:
        return path
    problem = "no chromium on PATH: run `make browser` (scripts/ensure-chromium.sh installs Debian's chromium)"
    if env_flag(REQUIRE_BROWSER, False):
        pytest.fail(f"{problem}; {REQUIRE_BROWSER}=1 makes this a failure, not a skip")
    pytest.skip(problem)


class Browser:
    """One Chromium process with one page; use as a context manager.

    Everything it writes lies in one folder of its own: the profile, and its temporary files (``TMPDIR``), which
    a killed Chromium would otherwise leave in /tmp. Its processes form a session of their own, so that closing it
    can wait for every one of them (the network, storage and GPU processes write into the profile too) before the
    folder is removed."""

    def __init__(self, executable: str) -> None:
        self._root = Path(tempfile.mkdtemp(prefix="terminus-chromium-"))
        profile, scratch = self._root / "profile", self._root / "tmp"
        profile.mkdir()
        scratch.mkdir()
        to_browser_read, self._to_browser = os.pipe()
        self._from_browser, from_browser_write = os.pipe()

        def give_pipes() -> None:  # runs in the child: the pipes become its fds 3 and 4
            high_read = fcntl.fcntl(to_browser_read, fcntl.F_DUPFD, 10)
            high_write = fcntl.fcntl(from_browser_write, fcntl.F_DUPFD, 10)
            os.dup2(high_read, 3)
            os.dup2(high_write, 4)

        try:
            self._process = subprocess.Popen(
                [executable, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe",
                 f"--window-size={WIDTH},900", "about:blank"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=False, preexec_fn=give_pipes,
                start_new_session=True, env={**os.environ, "TMPDIR": str(scratch)},
            )  # fmt: skip
        except BaseException:
            for fd in (to_browser_read, self._to_browser, self._from_browser, from_browser_write):
                os.close(fd)
            shutil.rmtree(self._root)
            raise
        os.close(to_browser_read)
        os.close(from_browser_write)
        self._buffer = b""
        self._next_id = 0
        self._events: list[dict[str, Any]] = []
        try:
            target = self.call("Target.createTarget", url="about:blank")["targetId"]
            self._session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
            self.call("Page.enable", session=True)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Ask Chromium to close, make sure none of its processes is left, and only then remove its folder."""
        if self._process.poll() is None:
            with contextlib.suppress(OSError):  # a browser that already closed its pipe is killed below
                self._send({"id": self._next_id + 1, "method": "Browser.close", "params": {}})
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=CLOSE_WAIT_S)
        left = end_group(self._process.pid, KILL_WAIT_S)  # helpers still flushing, or a browser that did not close
        self._process.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)
        if left:
            raise RuntimeError(f"chromium's processes {left} outlived SIGKILL for {KILL_WAIT_S:.0f} s; "
                               f"{self._root} is left for them")  # fmt: skip
        shutil.rmtree(self._root)

    def call(self, method: str, *, session: bool = False, timeout: float = 30, **params: Any) -> dict[str, Any]:
        """Send one command; its result (events that arrive meanwhile are kept for :meth:`wait_for`)."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self._session
        self._send(message)
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self._events.append(reply)

    def wait_for(self, event: str, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for index, seen in enumerate(self._events):
                if seen.get("method") == event:
                    return self._events.pop(index)
            self._events.append(self._read(deadline))

    def open(self, page: Path) -> None:
        self._events.clear()
        self.call("Page.navigate", session=True, url=page.resolve().as_uri())
        self.wait_for("Page.loadEventFired")

    def follow(self, selector: str) -> str:
        """Click the link ``selector`` finds, as a person would, and wait for the page it opens to load; its URL."""
        self._events.clear()
        self.evaluate(f"document.querySelector({json.dumps(selector)}).click()")
        self.wait_for("Page.loadEventFired")
        return self.evaluate("location.href")

    def shown_text(self) -> str:
        """The text the page renders, as a reader sees it."""
        reply = self.call("Runtime.evaluate", session=True, expression="document.body.innerText", returnByValue=True)
        return reply["result"]["value"]

    def evaluate(self, expression: str) -> Any:
        """The expression's value in the page (None for ``undefined``); an exception it throws is raised here."""
        reply = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True)
        if "exceptionDetails" in reply:
            thrown = reply["exceptionDetails"].get("exception") or {}
            raise RuntimeError(f"{expression}: {thrown.get('description') or reply['exceptionDetails'].get('text')}")
        return reply["result"].get("value")

    def screenshot(self, path: Path) -> tuple[int, int]:
        """The whole page (beyond the window) as a PNG; its size in CSS pixels."""
        size = self.call("Page.getLayoutMetrics", session=True)["cssContentSize"]
        width, height = int(size["width"]), int(size["height"])
        shot = self.call("Page.captureScreenshot", session=True, format="png", captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": width, "height": height, "scale": 1})  # fmt: skip
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        return width, height

    def _send(self, message: dict[str, Any]) -> None:
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("chromium did not answer in time")
            if self._process.poll() is not None:
                raise RuntimeError(f"chromium exited with {self._process.returncode}")
            if not select.select([self._from_browser], [], [], min(left, 1.0))[0]:
                continue
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed its DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)
