"""The host end of the control channel: one long-lived ``docker exec`` of the agent per container.

The exec's hijacked socket carries JSON lines to the agent's stdin; its stdout comes back in
Docker's multiplexed frames (8-byte header: stream, 0, 0, 0, big-endian length). Requests
carry an id, so many can be in flight at once.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import struct
from importlib import resources
from typing import Any

import docker

from terminus_env.sandbox.errors import SandboxError, TerminalGone

# Package data, read through importlib.resources so it is found wherever the package is installed.
AGENT_SOURCE = resources.files("terminus_env.sandbox").joinpath("agent.py").read_text(encoding="utf-8")
# The agent's source comes as the first line on stdin, so `ps` in the sandbox shows this short line only.
_BOOTSTRAP = 'import sys,json;exec(compile(json.loads(sys.stdin.buffer.readline()),"terminus-agent","exec"))'

_STDERR_KEEP = 4000


class Channel:
    """Request/response over one agent process; ``request`` raises TerminalGone once the agent is gone."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count()
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._stderr = b""
        self._closed_reason: str | None = None
        self._pump = asyncio.get_running_loop().create_task(self._read_frames())

    @classmethod
    async def open(cls, client: docker.DockerClient, container_id: str) -> Channel:
        sock = await asyncio.to_thread(_start_agent, client, container_id)
        reader, writer = await asyncio.open_connection(sock=sock)
        writer.write(json.dumps(AGENT_SOURCE).encode() + b"\n")  # read by _BOOTSTRAP
        channel = cls(reader, writer)
        try:
            await channel.request("ping", 30)
        except TerminalGone as exc:
            await channel.close()
            raise SandboxError(
                f"the sandbox agent could not start in {container_id[:12]} ({exc}); it needs python3 in the image: "
                "add it to the task's Dockerfile (e.g. `apt-get install -y python3`) or build FROM the base image"
            ) from exc
        return channel

    async def request(self, op: str, wait_s: float, **fields: Any) -> dict[str, Any]:
        """Send one request and wait for its answer (``wait_s`` guards against a wedged agent)."""
        if self._closed_reason is not None:
            raise TerminalGone(self._closed_reason)
        ident = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[ident] = future
        try:
            self._writer.write(json.dumps({"id": ident, "op": op, **fields}).encode() + b"\n")
            await self._writer.drain()
            reply = await asyncio.wait_for(future, wait_s)
        except (ConnectionError, OSError) as exc:
            raise TerminalGone(f"the sandbox's control channel broke ({exc}); the container is gone") from exc
        except asyncio.TimeoutError:
            raise SandboxError(
                f"the sandbox agent did not answer {op!r} within {wait_s:g} s; close this sandbox and start a new one"
            ) from None
        finally:
            self._pending.pop(ident, None)
        if not reply.get("ok"):
            raise SandboxError(f"the sandbox agent failed on {op!r}: {reply.get('error')}")
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
                    self._deliver(json.loads(line))
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            self._fail_all()

    def _deliver(self, reply: dict[str, Any]) -> None:
        future = self._pending.get(reply.get("id"))  # type: ignore[arg-type]
        if future is not None and not future.done():
            future.set_result(reply)

    def _fail_all(self) -> None:
        detail = self._stderr.decode(errors="replace").strip()
        self._closed_reason = "the sandbox's control agent exited; the container is gone or was stopped" + (
            f" (agent stderr: {detail[-500:]})" if detail else ""
        )
        for future in self._pending.values():
            if not future.done():
                future.set_exception(TerminalGone(self._closed_reason))

    @property
    def closed(self) -> bool:
        return self._closed_reason is not None

    async def close(self) -> None:
        """Close the socket; the agent sees end of input and stops the container."""
        if not self._writer.is_closing():
            self._writer.close()
        self._pump.cancel()
        await asyncio.gather(self._pump, return_exceptions=True)


def _start_agent(client: docker.DockerClient, container_id: str) -> socket.socket:
    """Exec the agent and return a private duplicate of the hijacked socket, ready for asyncio."""
    try:
        exec_id = client.api.exec_create(
            container_id,
            ["python3", "-c", _BOOTSTRAP, "--stop-container-on-eof"],
            stdin=True, stdout=True, stderr=True, user="0",
        )["Id"]  # fmt: skip
        raw = client.api.exec_start(exec_id, socket=True)
    except docker.errors.APIError as exc:
        raise SandboxError(f"cannot start the sandbox agent in {container_id[:12]}: {exc}") from exc
    sock = getattr(raw, "_sock", raw)
    if not isinstance(sock, socket.socket) or type(sock) is not socket.socket:
        raise SandboxError("the control channel needs a unix:// or tcp:// DOCKER_HOST without TLS")
    private = sock.dup()
    response = getattr(raw, "_response", None)
    if response is not None:
        response.close()
    raw.close()
    return private
