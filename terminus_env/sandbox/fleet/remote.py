"""A sandbox on another node, with the interface of a local :class:`Sandbox`: one actor call per operation.

The env and grading use it unchanged. What a local sandbox knows without asking (the disk limit the agent broke,
whether it is alive, its daemon's stderr after a failure) comes back with every answer, so reading it costs no call.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from terminus_env.sandbox.archives import tar_dir, tar_file
from terminus_env.sandbox.errors import DiskLimitExceeded, SandboxError, SandboxLost
from terminus_env.sandbox.fleet.link import HostLink
from terminus_env.sandbox.fleet.wire import Answer, SandboxState, Started, error_from_wire
from terminus_env.sandbox.sandbox import ExecResult, VerifierRun
from terminus_env.sandbox.spec import SandboxSpec
from terminus_env.sandbox.terminal import MAX_TURN_WAIT_S, MAX_WAIT_S, TerminalOutput, TerminalStep

CALL_MARGIN_S = 30.0
"""How much longer than the host's own deadline for an operation the pool waits for its answer."""
SHORT_OP_S = 30.0  # the host's deadline for a tmux capture, a read, stopping the agent (as in Sandbox)
COPY_S = 120.0  # copying files in: no deadline on the host's side, Docker's own


class RemoteSandbox:
    """A sandbox held by a host actor; made by ``RaySandboxPool.acquire``."""

    def __init__(
        self, link: HostLink, spec: SandboxSpec, started: Started, state: SandboxState | None,
        on_close: Callable[[RemoteSandbox], None],
    ) -> None:  # fmt: skip
        self.spec = spec
        self.id = started.sandbox_id
        self.image = started.image
        """The image the container runs on its host."""
        self.terminal = RemoteTerminal(self)
        self._link = link
        self._on_close = on_close
        self._closed = False
        self._alive = state.alive if state else True
        self._violation: DiskLimitExceeded | None = None
        self._daemon_stderr = ""

    @property
    def host(self) -> HostLink:
        return self._link

    async def exec(
        self, cmd: str, timeout: float, *, user: str | None = None, env: Mapping[str, str] | None = None,
        workdir: str | None = None,
    ) -> ExecResult:  # fmt: skip
        return await self.call("exec", timeout + 2 * CALL_MARGIN_S, cmd, timeout, user, dict(env or {}), workdir)

    async def verify(
        self, tests: bytes, cmd: str, timeout: float, *, user: str, env: Mapping[str, str] | None = None,
        read: Sequence[str] = (), max_bytes: int = 4_000_000, harbor_verdict: bool = False,
    ) -> VerifierRun:  # fmt: skip
        wait = timeout + 2 * CALL_MARGIN_S
        return await self.call("verify", wait, tests, cmd, timeout, user, dict(env or {}), list(read), max_bytes,
                               harbor_verdict)  # fmt: skip

    async def put_dir(self, local: Path, dest: str) -> None:
        local = Path(local)
        if not local.is_dir():
            raise SandboxError(f"put_dir: {local} is not a folder; pass the folder whose contents to copy")
        await self.call("put_archive", COPY_S, tar_dir(local, dest))

    async def put_file(self, data: bytes, dest: str, mode: int = 0o644) -> None:
        await self.call("put_archive", COPY_S, tar_file(data, dest, mode))

    async def read_file(self, path: str, max_bytes: int = 1_000_000) -> bytes | None:
        return await self.call("read_file", SHORT_OP_S + CALL_MARGIN_S, path, max_bytes)

    async def stop_agent(self) -> None:
        await self.call("stop_agent", SHORT_OP_S + CALL_MARGIN_S)

    @property
    def violation(self) -> DiskLimitExceeded | None:
        """The limit the agent broke, as of the last answer from the host."""
        return self._violation

    async def check_disk(self) -> DiskLimitExceeded | None:
        await self.call("check_disk", 2 * SHORT_OP_S + CALL_MARGIN_S)
        return self._violation

    async def lost_to_agent(self) -> bool:
        """See ``Sandbox.lost_to_agent``; False when the host is gone (its containers stopped with it) or does not
        answer."""
        if self._link.lost:
            return False
        try:
            return bool(await self.call("lost_to_agent", SHORT_OP_S + CALL_MARGIN_S))
        except SandboxError:
            return False

    @property
    def daemon_stderr(self) -> str:
        """The daemon's stderr as of the last failure the host reported ("" when the host itself is gone)."""
        return self._daemon_stderr

    @property
    def alive(self) -> bool:
        return not self._closed and self._alive and not self._link.lost

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        """Remove the container on its host; safe to call twice, and when the host is gone."""
        if self._closed:
            return
        self._closed = True
        try:
            if not self._link.lost:
                await self.call("close", SHORT_OP_S + CALL_MARGIN_S)
        except SandboxError:
            pass  # lost meanwhile: the container went with its host
        finally:
            self._on_close(self)

    async def __aenter__(self) -> RemoteSandbox:  # noqa: PYI034 - Python 3.10 has no typing.Self
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def call(self, method: str, wait_s: float, *args: Any) -> Any:
        """Call the host about this sandbox; raises the error the host's sandbox raised, typed as locally."""
        try:
            answer: Answer = await self._link.call(method, wait_s, self.id, *args)
        except SandboxLost:
            self._alive = False
            raise
        state = answer.state
        if state is not None:
            self._alive = state.alive
            if state.violation is not None and self._violation is None:
                violation = error_from_wire(state.violation)
                self._violation = violation if isinstance(violation, DiskLimitExceeded) else None
            if answer.error is not None:
                self._daemon_stderr = state.daemon_stderr
        if answer.error is not None:
            raise error_from_wire(answer.error)
        return answer.value


class RemoteTerminal:
    """The tmux terminal of a remote sandbox: each method is one call to its host."""

    def __init__(self, sandbox: RemoteSandbox) -> None:
        self._sandbox = sandbox

    async def send(self, keystrokes: str, duration: float) -> float:
        """Type ``keystrokes`` and wait as a local terminal does; returns the seconds waited, as seen here."""
        started = time.monotonic()
        wait = min(max(float(duration), 0.0), MAX_WAIT_S) + SHORT_OP_S + CALL_MARGIN_S
        await self._sandbox.call("send", wait, keystrokes, duration)
        return time.monotonic() - started

    async def step(self, commands: Sequence[tuple[str, float]], budget: float | None = None) -> TerminalStep:
        """A whole turn in one call to the host (see ``Terminal.step``)."""
        wait = sum(min(max(float(duration), 0.0), MAX_WAIT_S) for _, duration in commands)
        wait = min(wait if budget is None else min(wait, budget), MAX_TURN_WAIT_S)
        return await self._sandbox.call("step", wait + 2 * SHORT_OP_S + CALL_MARGIN_S, list(commands), budget)

    async def capture_new(self) -> TerminalOutput:
        return await self._sandbox.call("capture_new", 2 * SHORT_OP_S + CALL_MARGIN_S)

    async def screen(self) -> str:
        return await self._sandbox.call("screen", SHORT_OP_S + CALL_MARGIN_S)
