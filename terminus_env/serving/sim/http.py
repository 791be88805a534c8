"""Just enough HTTP/1.1 on asyncio streams for an OpenAI-style JSON API: keep-alive, Content-Length.

The simulator needs no web framework: requests are small JSON bodies and answers are whole
bodies, so a request parser, a response writer and a handler callback cover it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus

MAX_BODY_BYTES = 64 * 1024 * 1024
_HANGUP_POLL_S = 0.05


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    body: bytes

    def json(self) -> object:
        return json.loads(self.body)


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def json(cls, status: int, payload: object, headers: dict[str, str] | None = None) -> Response:
        return cls(status, json.dumps(payload).encode(), headers=headers or {})


class BadRequest(Exception):
    """The bytes on the wire are not an HTTP/1.1 request we can read."""


Handler = Callable[[Request], Awaitable[Response]]


async def read_request(reader: asyncio.StreamReader) -> Request | None:
    """The next request on a keep-alive connection, or None when the client closed it."""
    line = await reader.readline()
    if not line:
        return None
    try:
        method, target, _version = line.decode("latin-1").split()
    except ValueError as exc:
        raise BadRequest(f"bad request line {line[:80]!r}") from exc
    headers: dict[str, str] = {}
    while (raw := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = raw.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        raise BadRequest("chunked request bodies are not supported; send Content-Length")
    length = int(headers.get("content-length", "0") or 0)
    if length > MAX_BODY_BYTES:
        raise BadRequest(f"body of {length} bytes is over the {MAX_BODY_BYTES}-byte limit")
    body = await reader.readexactly(length) if length else b""
    return Request(method.upper(), target.split("?", 1)[0], headers, body)


def encode_response(response: Response, keep_alive: bool) -> bytes:
    reason = HTTPStatus(response.status).phrase
    head = [
        f"HTTP/1.1 {response.status} {reason}",
        f"content-type: {response.content_type}",
        f"content-length: {len(response.body)}",
        f"connection: {'keep-alive' if keep_alive else 'close'}",
    ]
    head += [f"{name}: {value}" for name, value in response.headers.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + response.body


async def serve_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handler: Handler) -> None:
    """Answer requests on one connection until the client closes it or asks to."""
    try:
        while True:
            try:
                request = await read_request(reader)
            except BadRequest as exc:
                writer.write(encode_response(Response.json(400, {"error": {"message": str(exc)}}), False))
                await writer.drain()
                return
            if request is None:
                return
            keep_alive = request.headers.get("connection", "").lower() != "close"
            response = await _unless_client_leaves(reader, handler(request))
            if response is None:
                return
            writer.write(encode_response(response, keep_alive))
            await writer.drain()
            if not keep_alive:
                return
    except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        return
    finally:
        writer.close()


async def _unless_client_leaves(reader: asyncio.StreamReader, answer: Awaitable[Response]) -> Response | None:
    """The handler's response, or None after cancelling it because the client hung up (as vLLM aborts)."""
    task = asyncio.ensure_future(answer)
    try:
        while True:
            await asyncio.wait({task}, timeout=_HANGUP_POLL_S)
            if task.done():
                return task.result()
            if reader.at_eof() or reader.exception() is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                return None
    finally:
        task.cancel()
