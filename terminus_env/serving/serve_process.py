"""``terminus-env serve`` from Python: start it as a child process, wait for its replicas, stop it.

For scripts that bring their own replicas (a training example, a benchmark, the real-vLLM tests). The
launcher owns the replicas' lives; stopping it (SIGTERM) stops them, and so does its death.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx

from terminus_env.errors import TerminusError

_API_SERVER_PID = re.compile(r"APIServer pid=(\d+)")


class ServeFailed(TerminusError):
    """``terminus-env serve`` exited or timed out before its replicas were ready; the message holds its log."""


class ServeProcess:
    """``with ServeProcess(["--model", path, "--dp", "2"], log_dir) as served: served.urls``.

    ``args`` are ``terminus-env serve``'s (``--log-dir`` is added: each replica's log goes there, the
    launcher's own messages to ``serve.err``); ``env`` adds variables for it and its replicas. ``timeout_s``
    bounds the start: the launcher is given it as ``--startup-timeout-s`` (``args`` may set another).
    """

    def __init__(
        self, args: Sequence[str], log_dir: Path, env: Mapping[str, str] | None = None, timeout_s: float = 1800.0
    ) -> None:
        self.log_dir = Path(log_dir)
        self.urls: list[str] = []
        self.lines: list[str] = []  # what the launcher printed up to "ready"
        self.startup_s = 0.0
        self._cmd = [sys.executable, "-m", "terminus_env.cli", "serve", "--log-dir", str(self.log_dir),
                     "--startup-timeout-s", str(timeout_s), *args]  # fmt: skip
        self._env = {**os.environ, **(env or {})}
        self._timeout_s = timeout_s
        self.proc: subprocess.Popen | None = None

    def start(self) -> ServeProcess:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        with open(self.log_dir / "serve.err", "w") as err:
            self.proc = subprocess.Popen(self._cmd, env=self._env, stdout=subprocess.PIPE, stderr=err, text=True)
        try:
            self._read_until_ready(started)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - started
        return self

    def _read_until_ready(self, started: float) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:  # the launcher prints each URL, then "evaluate with: ..." once all answer
            self.lines.append(line.rstrip())
            if line.startswith("  http://"):
                self.urls.append(line.split()[0])
            if line.startswith("evaluate with:"):
                return
            if time.monotonic() - started > self._timeout_s:
                raise ServeFailed(f"replicas not ready in {self._timeout_s:.0f}s; see {self.log_dir}")
        raise ServeFailed(f"terminus-env serve exited with code {self.proc.wait()}: {self.launcher_log()[-3000:]}")

    def launcher_log(self) -> str:
        return (self.log_dir / "serve.err").read_text()

    def replica_pid(self, index: int) -> int:
        """Replica ``index``'s API server: the leader of its process group (vLLM names it in its log, which a restart
        appends to: the last one named is the one running)."""
        pids = _API_SERVER_PID.findall((self.log_dir / f"replica-{index}.log").read_text())
        if not pids:
            raise ServeFailed(f"no 'APIServer pid=' line in {self.log_dir / f'replica-{index}.log'}")
        return int(pids[-1])

    def stop(self, timeout_s: float = 90.0) -> None:
        """SIGTERM the launcher, which stops its replicas; wait until none answers."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        deadline = time.monotonic() + 30
        while any(_answers(url) for url in self.urls):
            if time.monotonic() > deadline:
                raise ServeFailed(f"a replica of {self.urls} still answers after its launcher stopped")
            time.sleep(0.5)

    def __enter__(self) -> ServeProcess:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _answers(url: str) -> bool:
    try:
        httpx.get(f"{url}/health", timeout=1.0)
    except httpx.HTTPError:
        return False
    return True


def free_ports(n: int) -> int:
    """A base port with ``n`` free ports after it on 127.0.0.1, for ``serve --port`` (replica i takes base + i)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n < 65535 and all(_port_free(base + i) for i in range(n)):
            return base
    raise RuntimeError("no run of free ports")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
