"""The host end of the control channel: one long-lived ``docker exec`` per container, whose streams the control
daemon takes over.

The container's main process forks the daemon once the container is split (daemon.py); the exec runs a small
relay that passes its stdin, stdout and stderr to the daemon over a socket on the host's side of the container,
then waits. So the exec's hijacked socket carries JSON lines to the daemon's stdin, and its stdout comes back in
Docker's multiplexed frames (8-byte header: stream, 0, 0, 0, big-endian length), with no copy in between.
Requests carry an id, so many can be in flight at once. A line that is not a reply is dropped and counted: it fails
no request and never the channel.
"""

from __future__ import annotations

import asyncio
import base64
import errno
import functools
import importlib.util
import itertools
import json
import marshal
import socket
import struct
import zlib
from importlib import resources
from typing import Any

import docker

from terminus_env.sandbox.errors import BrokenByAgent, ResourcesExhausted, SandboxError, SandboxLost

# Package data, read through importlib.resources so it is found wherever the package is installed.
DAEMON_SOURCE = resources.files("terminus_env.sandbox").joinpath("daemon.py").read_text(encoding="utf-8")
"""The in-container code: the container's main process and the control daemon (see daemon.py)."""
LOG_PREFIX = "terminus-env: "
"""Starts every line the container's main process writes to the container's log (daemon.py has the same)."""
SOURCE_VARIABLE, COMPILED_VARIABLE = "TERMINUS_SANDBOX_SOURCE", "TERMINUS_SANDBOX_COMPILED"
"""The container's main process reads its code from these variables (and removes both from its environment):
DAEMON_SOURCE, and the same compiled by this Python, each zlib-compressed and base64-encoded."""
# The compiled code runs where the container's Python has this Python's bytecode magic (the same minor version);
# any other compiles the source. Compiling costs ~30 ms of a start's CPU here.
_MAIN_BOOTSTRAP = (
    "import os,sys,zlib,binascii,marshal;"
    "d=lambda n:zlib.decompress(binascii.a2b_base64(os.environ.pop(n)));"
    f"s,c=d({SOURCE_VARIABLE!r}),d({COMPILED_VARIABLE!r});"
    "m=sys.modules['_frozen_importlib_external'].MAGIC_NUMBER;"
    "exec(marshal.loads(c[len(m):]) if c[:len(m)]==m else compile(s,'terminus-sandbox','exec'))"
)
MAIN_COMMAND = ["python3", "-I", "-S", "-c", _MAIN_BOOTSTRAP, "main"]
CHANNEL_SOCKET = "/run/terminus/channel"
"""Where the daemon waits for the relay: the host's side of the container only (daemon.py has the same)."""
# The relay makes itself undumpable and names itself, connects as soon as the daemon listens, passes its three
# standard streams over, then waits until the daemon ends (the exec, and so the channel, lasts as long as the relay).
# Its looks for the socket slow down to one per 20 ms: an ENTRYPOINT may take a minute to hand over.
_RELAY = """
import ctypes
libc = ctypes.CDLL(None)
libc.prctl(4, 0, 0, 0, 0)
libc.prctl(15, b"terminus-relay", 0, 0, 0)
import array, socket, sys, time
deadline, pause = time.monotonic() + float(sys.argv[1]), 0.001
while True:
    relay = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        relay.connect(sys.argv[2])
        break
    except OSError:
        relay.close()
        if time.monotonic() > deadline:
            sys.exit("the container's main process did not start the sandbox daemon within %s s" % sys.argv[1])
        time.sleep(pause)
        pause = min(pause * 2, 0.02)
relay.sendmsg([b"s"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]).tobytes())])
relay.recv(1)
"""
_STDERR_KEEP = 4000
_SPLIT_MARGIN_S = 15.0  # beyond the handover time: how long the main process may take to split the container
_EXHAUSTED = {errno.EAGAIN, errno.ENOMEM}


class Channel:
    """Request/response over one daemon process; ``request`` raises SandboxLost once the daemon is gone."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count()
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._stderr = b""
        self._closed_reason: str | None = None
        self.dropped_lines = 0
        """Lines on the daemon's stdout that were not a reply to a pending request."""
        self._pump = asyncio.get_running_loop().create_task(self._read_frames())

    @classmethod
    async def open(cls, client: docker.DockerClient, container_id: str, start_s: float) -> tuple[Channel, str]:
        """Connect to the daemon and wait (up to ``start_s``) until the container is split; returns how the image's
        ENTRYPOINT handed over ("ready", "exited N" or "no-handover")."""
        # The daemon starts once the handover is judged, up to start_s later: the relay waits longer.
        argv = [str(start_s + _SPLIT_MARGIN_S), CHANNEL_SOCKET]
        sock = await asyncio.to_thread(_start_relay, client, container_id, argv)
        reader, writer = await asyncio.open_connection(sock=sock)
        channel = cls(reader, writer)
        try:
            reply = await channel.request("ping", start_s + 2 * _SPLIT_MARGIN_S)
        except SandboxLost as exc:
            await channel.close()
            raise SandboxError(
                f"the sandbox daemon could not start in {container_id[:12]} ({exc}); it needs python3 with ctypes in "
                "the image: add it to the task's Dockerfile (e.g. `apt-get install -y python3`) or build FROM the "
                "base image"
            ) from exc
        except SandboxError:
            await channel.close()
            raise
        return channel, str(reply.get("handover"))

    async def request(self, op: str, wait_s: float, **fields: Any) -> dict[str, Any]:
        """Send one request and wait for its answer (``wait_s`` guards against a wedged daemon)."""
        if self._closed_reason is not None:
            raise SandboxLost(self._closed_reason)
        ident = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[ident] = future
        try:
            self._writer.write(json.dumps({"id": ident, "op": op, **fields}).encode() + b"\n")
            await self._writer.drain()
            reply = await asyncio.wait_for(future, wait_s)
        except asyncio.TimeoutError:  # before OSError: on Python 3.11 a TimeoutError is an OSError
            raise SandboxError(
                f"the sandbox daemon did not answer {op!r} within {wait_s:g} s (is the container paused?); "
                "close this sandbox and start a new one"
            ) from None
        except (ConnectionError, OSError) as exc:
            raise SandboxLost(f"the sandbox's control channel broke ({exc}); the container is gone") from exc
        finally:
            self._pending.pop(ident, None)
        if not reply.get("ok"):
            if reply.get("spawn_errno") in _EXHAUSTED:
                raise ResourcesExhausted(f"nothing more can start in the sandbox ({reply.get('error')})")
            if reply.get("blame") == "agent":
                raise BrokenByAgent(f"the sandbox could not do {op!r} after what the agent did: {reply.get('error')}")
            raise SandboxError(f"the sandbox daemon failed on {op!r}: {reply.get('error')}")
        return reply

    async def _read_frames(self) -> None:
        buffer = b""
        try:
            while True:
                header = await self._reader.readexactly(8)
                stream, size = header[0], struct.unpack(">I", header[4:])[0]
                payload = await self._reader.readexactly(size)
                if stream == 2:
                    self._stderr = (self._stderr + payload)[-_STDERR_KEEP:]
                    continue
                buffer += payload
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    self._deliver(line)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            self._fail_all()

    def _deliver(self, line: bytes) -> None:
        try:
            reply = json.loads(line)
        except ValueError:
            reply = None
        future = self._pending.get(reply.get("id")) if isinstance(reply, dict) else None  # type: ignore[arg-type]
        if future is None or future.done():
            self.dropped_lines += 1
            return
        future.set_result(reply)

    def _fail_all(self) -> None:
        detail = self._stderr.decode(errors="replace").strip()
        self._closed_reason = "the sandbox's control daemon exited; the container is gone or was stopped" + (
            f" (daemon stderr: {detail[-500:]})" if detail else ""
        )
        for future in self._pending.values():
            if not future.done():
                future.set_exception(SandboxLost(self._closed_reason))

    @property
    def closed(self) -> bool:
        return self._closed_reason is not None

    @property
    def stderr(self) -> str:
        """The tail of what the daemon wrote to its stderr (a traceback there means a bug on our side)."""
        return self._stderr.decode(errors="replace")

    async def close(self) -> None:
        """Close the socket; the daemon sees end of input and stops the container."""
        if not self._writer.is_closing():
            self._writer.close()
        self._pump.cancel()
        await asyncio.gather(self._pump, return_exceptions=True)


@functools.cache
def main_environment() -> dict[str, str]:
    """The variables MAIN_COMMAND reads DAEMON_SOURCE from (made once per process)."""
    return code_variables(DAEMON_SOURCE)


def code_variables(source: str, magic: bytes = importlib.util.MAGIC_NUMBER) -> dict[str, str]:
    """``source`` and its code compiled here (``magic`` first), as MAIN_COMMAND reads them."""
    compiled = magic + marshal.dumps(compile(source, "terminus-sandbox", "exec"))
    return {
        SOURCE_VARIABLE: base64.b64encode(zlib.compress(source.encode(), 9)).decode(),
        COMPILED_VARIABLE: base64.b64encode(zlib.compress(compiled, 9)).decode(),
    }


def _running(client: docker.DockerClient, container_id: str) -> bool:
    try:
        return bool(client.api.inspect_container(container_id)["State"]["Running"])
    except docker.errors.APIError:  # NotFound included: removed
        return False


def _start_relay(client: docker.DockerClient, container_id: str, argv: list[str]) -> socket.socket:
    """Exec the relay and return a private duplicate of the hijacked socket, ready for asyncio."""
    try:
        exec_id = client.api.exec_create(
            container_id, ["python3", "-I", "-S", "-c", _RELAY, *argv], stdin=True, stdout=True, stderr=True,
            user="0",
        )["Id"]  # fmt: skip
        raw = client.api.exec_start(exec_id, socket=True)
    except docker.errors.APIError as exc:
        # Gone or not running: the main process died at once. Docker says so with 404 or 409, or with a 500 while
        # the auto-removal runs ("is not running: Removal In Progress"), so ask the container itself.
        if exc.status_code in (404, 409) or not _running(client, container_id):
            raise SandboxError(
                f"container {container_id[:12]} stopped as soon as it started: its main process needs python3 with "
                "ctypes in the image; add it to the task's Dockerfile (e.g. `apt-get install -y python3`) or build "
                f"FROM the base image ({exc.explanation or exc})"
            ) from exc
        raise SandboxError(f"cannot start the sandbox daemon in {container_id[:12]}: {exc}") from exc
    sock = getattr(raw, "_sock", raw)
    if not isinstance(sock, socket.socket) or type(sock) is not socket.socket:
        raise SandboxError("the control channel needs a unix:// or tcp:// DOCKER_HOST without TLS")
    private = sock.dup()
    response = getattr(raw, "_response", None)
    if response is not None:
        response.close()
    raw.close()
    return private
