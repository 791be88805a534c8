"""Builds with the Docker engine's own BuildKit, through the engine's API: no buildx, no CLI, no session.

The request is the classic builder's (the build context as a tar in the body) with ``version=2``. Debian's
``docker.io`` 20.10 engine builds it with its embedded BuildKit, so ``COPY a b .`` and ``RUN --mount=type=cache``
work, offline. The engine streams BuildKit's progress as base64 protobuf ``StatusResponse`` messages
(``moby.buildkit.trace``); they are decoded here only as far as a build log needs: each step's name, its output,
its error.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

import docker
from docker.utils.json_stream import json_stream

TRACE = "moby.buildkit.trace"
MIN_API = (1, 39)
"""Docker 18.09, the first engine with BuildKit inside."""
_VERTEX, _LOG = 1, 3  # StatusResponse: repeated Vertex vertexes = 1; repeated VertexLog logs = 3
_VERTEX_DIGEST, _VERTEX_NAME, _VERTEX_ERROR = 1, 3, 7
_LOG_VERTEX, _LOG_MSG = 1, 4


class BuildkitRefused(Exception):
    """The engine answered a BuildKit build with an error before building anything: it has no BuildKit to offer."""


def engine_has_buildkit(version: Mapping[str, Any]) -> tuple[bool, str]:
    """Whether an engine (``docker version``'s answer) has BuildKit, and if not, why not."""
    os_type = str(version.get("Os", "linux")).lower()
    if os_type != "linux":
        return False, f"the engine runs {os_type} containers, for which Docker has no BuildKit"
    api = str(version.get("ApiVersion", "0"))
    try:
        numbers = tuple(int(part) for part in api.split(".")[:2])
    except ValueError:
        return False, f"the engine's API version {api!r} cannot be read"
    if numbers < MIN_API:
        return False, f"the engine's API is {api}, and BuildKit needs {'.'.join(map(str, MIN_API))} (Docker 18.09)"
    return True, ""


def start_build(
    client: docker.DockerClient, archive: IO[bytes], params: Mapping[str, str], timeout: float
) -> Generator[dict[str, Any], None, None]:
    """Send a build to the engine's BuildKit; its messages, decoded, as they come. ``params`` are the engine's
    ``/build`` query parameters (``t``, ``dockerfile``, ``labels``, ...). Raises BuildkitRefused if the engine
    refuses the build outright."""
    url = f"{client.api.base_url}/v{client.api.api_version}/build"
    response = client.api.post(
        url, params={**params, "version": "2"}, data=archive, headers={"Content-Type": "application/x-tar"},
        stream=True, timeout=timeout,
    )  # fmt: skip
    if response.status_code >= 400:
        detail = response.text.strip()
        response.close()
        try:
            detail = json.loads(detail).get("message", detail)
        except (ValueError, AttributeError):
            pass
        raise BuildkitRefused(f"HTTP {response.status_code}: {detail or response.reason}")
    try:
        yield from json_stream(response.iter_content(chunk_size=None))
    finally:
        response.close()  # a build given up on (its timeout) is cancelled by the engine when the request goes


@dataclass
class BuildLog:
    """The readable log of one BuildKit build: fed the engine's trace messages, it keeps each step's name when it
    starts, the step's output line by line, and the step's error."""

    lines: list[str] = field(default_factory=list)
    _named: set[bytes] = field(default_factory=set)
    _partial: dict[bytes, bytes] = field(default_factory=dict)

    def feed(self, aux: Any) -> None:
        """Take one ``moby.buildkit.trace`` message's ``aux`` (base64 protobuf); anything unreadable is skipped."""
        try:
            message = base64.b64decode(aux) if isinstance(aux, str) else b""
            for number, value in _fields(message):
                if number == _VERTEX and isinstance(value, bytes):
                    self._vertex(dict(_fields(value)))
                elif number == _LOG and isinstance(value, bytes):
                    self._log(dict(_fields(value)))
        except (binascii.Error, IndexError, ValueError):
            return

    def text(self) -> str:
        return "\n".join(self.lines)

    def flush(self) -> None:
        """End every step's unfinished line (a build that ended mid-line)."""
        for partial in self._partial.values():
            if partial:
                self.lines.append(_text(partial))
        self._partial.clear()

    def _vertex(self, vertex: dict[int, Any]) -> None:
        digest = _bytes(vertex.get(_VERTEX_DIGEST))
        name = _bytes(vertex.get(_VERTEX_NAME))
        if name and digest not in self._named:
            self._named.add(digest)
            self.lines.append(f"=> {_text(name)}")
        error = _bytes(vertex.get(_VERTEX_ERROR))
        if error:
            self.lines.append(f"ERROR {_text(name) or 'a step'}: {_text(error)}")

    def _log(self, log: dict[int, Any]) -> None:
        digest = _bytes(log.get(_LOG_VERTEX))
        text = self._partial.pop(digest, b"") + _bytes(log.get(_LOG_MSG))
        *complete, rest = text.split(b"\n")
        self.lines.extend(_text(line) for line in complete)
        if rest:
            self._partial[digest] = rest


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """The (field number, value) pairs of a protobuf message: varints as ints, length-delimited fields as bytes
    (fixed-width ones, which no field read here has, as their raw bytes)."""
    index = 0
    while index < len(data):
        key, index = _varint(data, index)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, index = _varint(data, index)
            yield number, value
        elif wire_type == 2:
            length, index = _varint(data, index)
            yield number, data[index : index + length]
            index += length
        elif wire_type in (1, 5):
            width = 8 if wire_type == 1 else 4
            yield number, data[index : index + width]
            index += width
        else:
            raise ValueError(f"protobuf wire type {wire_type} is not one BuildKit's status uses")


def _varint(data: bytes, index: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[index]
        index += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, index
        shift += 7


def _bytes(value: int | bytes | None) -> bytes:
    return value if isinstance(value, bytes) else b""


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace").rstrip("\r")
