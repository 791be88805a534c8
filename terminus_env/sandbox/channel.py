"""The host end of the control channel to a sandbox's daemon, by one of two routes (inside/channel.py has the other).

DIRECT, on a local engine: the host makes a folder of its own for the sandbox and listens on a socket there, the
engine mounts the folder into the container, and the daemon connects once the container is split. One unix socket
carries JSON lines both ways: a round trip costs ~0.1 ms and a start needs no ``docker exec``. The host takes the
first connection as the daemon's: only the container's first namespaces (the main process, the daemon and what
the host itself execs there) have the folder; the agent's and the verifier's sides have it covered from before
anything of theirs runs.

RELAY, on any engine: one long-lived ``docker exec`` per container runs a small relay that passes its stdin,
stdout and stderr to the daemon over a socket on the host's side of the container, then waits. So the exec's
hijacked socket carries JSON lines to the daemon's stdin, and its stdout comes back in Docker's multiplexed frames
(8-byte header: stream, 0, 0, 0, big-endian length), with no copy in between.

Requests carry an id, so many can be in flight at once. A line that is not a reply is dropped and counted: it fails
no request and never the channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import errno
import itertools
import json
import os
import shutil
import socket
import struct
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import docker
from docker.types import Mount

from terminus_env import config
from terminus_env.config import ConfigError
from terminus_env.sandbox.cleanup import REGISTRY
from terminus_env.sandbox.errors import (
    BrokenByAgent,
    DaemonFailed,
    DaemonUnanswered,
    ResourcesExhausted,
    SandboxError,
    SandboxLost,
)
from terminus_env.sandbox.owner import Owner, host_id

LOG_PREFIX = "terminus-env: "
"""Starts every line the container's main process writes to the container's log (inside/names.py has the same)."""
CHANNEL_SOCKET = "/run/terminus/channel"
"""Where the daemon waits for the relay: the host's side of the container only (inside/names.py has the same)."""
CHANNEL_DIR = "/run/terminus-channel"
"""Where a DIRECT sandbox's channel folder is mounted in the container (inside/names.py has the same)."""
LOCAL_ENGINE_URL = "http+docker://localhost"
"""docker-py's base URL for an engine on a unix socket (a TCP, SSH or named-pipe engine has another)."""


class Route(enum.Enum):
    """How the host reaches a sandbox's daemon (the main process's CHANNEL argument; inside/names.py has both)."""

    DIRECT = "direct"
    RELAY = "relay"


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
ACCEPT_POLL_S = 1.0
"""How long one wait for the daemon's connection lasts before the start's deadline is looked at again."""
ENGINE_CHECK_S = 1.0
"""How often a start waiting for the daemon asks Docker whether the container still runs."""


class _Lines:
    """Cuts a byte stream into lines. A line that comes in many pieces (a reply may be megabytes, in frames of a few
    bytes) is joined once, when it ends: each byte is copied a bounded number of times, however it was cut."""

    def __init__(self) -> None:
        self._start: list[bytes] = []  # the pieces of the line not yet ended

    def feed(self, chunk: bytes) -> list[bytes]:
        """The lines that ``chunk`` ends, without their newlines."""
        if b"\n" not in chunk:
            self._start.append(chunk)
            return []
        *lines, tail = chunk.split(b"\n")
        lines[0] = b"".join([*self._start, lines[0]])
        self._start = [tail] if tail else []
        return lines


class Channel:
    """Request/response over one daemon process; ``request`` raises SandboxLost once the daemon is gone."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, folder: ChannelFolder | None = None
    ) -> None:
        self.route = Route.RELAY if folder is None else Route.DIRECT
        self._folder = folder
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count()
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._stderr = b""
        self._closed_reason: str | None = None
        self.dropped_lines = 0
        """Lines on the daemon's stdout that were not a reply to a pending request."""
        self.unanswered_is_agents: Callable[[], bool] | None = None
        """Once the agent exists: whether a request the daemon did not answer in time is the agent's doing (asked in
        a thread; see ``DaemonUnanswered``). Before, it is the infrastructure's: nothing of the agent's ran yet."""
        reading = self._read_frames() if folder is None else self._read_lines()
        self._pump = asyncio.get_running_loop().create_task(reading)

    @classmethod
    async def open(
        cls, client: docker.DockerClient, container_id: str, start_s: float, folder: ChannelFolder | None = None
    ) -> tuple[Channel, str]:
        """Connect to the daemon (through ``folder`` when the route is DIRECT, else through the relay) and wait (up
        to ``start_s``) until the container is split; returns how the image's ENTRYPOINT handed over ("ready",
        "exited N" or "no-handover")."""
        wait_s = start_s + _SPLIT_MARGIN_S  # the split may take a while on a loaded host
        if folder is None:
            sock = await asyncio.to_thread(_start_relay, client, container_id, [str(wait_s), CHANNEL_SOCKET])
            reader, writer = await asyncio.open_connection(sock=sock)
            channel = cls(reader, writer)
        else:
            reader, writer = await _accept(client, container_id, folder, wait_s)
            channel = cls(reader, writer, folder)
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
            blame = self.unanswered_is_agents
            if blame is not None and await asyncio.to_thread(blame):
                raise DaemonUnanswered(
                    f"the sandbox daemon did not answer {op!r} within {wait_s:g} s in a running, unpaused container: "
                    "the agent's processes stalled it (its terminal stopped, or its CPU taken)"
                ) from None
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
            raise DaemonFailed(f"the sandbox daemon failed on {op!r}: {reply.get('error')}")
        return reply

    async def _read_frames(self) -> None:
        lines = _Lines()
        try:
            while True:
                header = await self._reader.readexactly(8)
                stream, size = header[0], struct.unpack(">I", header[4:])[0]
                payload = await self._reader.readexactly(size)
                if stream == 2:
                    self._stderr = (self._stderr + payload)[-_STDERR_KEEP:]
                    continue
                for line in lines.feed(payload):
                    self._deliver(line)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            self._fail_all()

    async def _read_lines(self) -> None:
        lines = _Lines()
        try:
            while chunk := await self._reader.read(1 << 16):
                for line in lines.feed(chunk):
                    self._deliver(line)
        except (ConnectionError, OSError):
            pass
        finally:
            self._fail_all()

    def _deliver(self, line: bytes) -> None:
        try:
            reply = json.loads(line)
        except ValueError:
            reply = None
        if isinstance(reply, dict) and "id" not in reply and isinstance(reply.get("stderr"), str):
            self._stderr = (self._stderr + reply["stderr"].encode())[-_STDERR_KEEP:]  # a DIRECT daemon's stderr
            return
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
        """Close the socket (the daemon sees end of input and stops the container) and remove the channel's
        folder."""
        if not self._writer.is_closing():
            self._writer.close()
        self._pump.cancel()
        await asyncio.gather(self._pump, return_exceptions=True)
        if self._folder is not None:
            self._folder.remove()


def _running(client: docker.DockerClient, container_id: str) -> bool:
    try:
        return bool(client.api.inspect_container(container_id)["State"]["Running"])
    except docker.errors.APIError:  # NotFound included: removed
        return False


def _stopped_at_once(container_id: str, detail: str) -> SandboxError:
    return SandboxError(
        f"container {container_id[:12]} stopped as soon as it started: its main process needs python3 with ctypes "
        "in the image; add it to the task's Dockerfile (e.g. `apt-get install -y python3`) or build FROM the base "
        f"image{f' ({detail})' if detail else ''}"
    )


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
            raise _stopped_at_once(container_id, str(exc.explanation or exc)) from exc
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


# ----- the DIRECT route ----------------------------------------------------------------------------------------


def channel_route(
    client: docker.DockerClient, info: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> Route:
    """DIRECT where this process can share a folder with the engine's containers, RELAY elsewhere; the
    TERMINUS_SANDBOX_CHANNEL setting (auto, direct, relay) can ask for either."""
    raw = (config.env_str(config.SANDBOX_CHANNEL, "auto", environ) or "").strip().lower()
    if raw not in ("auto", *(route.value for route in Route)):
        raise ConfigError(f"{config.SANDBOX_CHANNEL}={raw!r} names no route: set it to auto, direct or relay")
    if raw == Route.RELAY.value:
        return Route.RELAY
    why_not = direct_unreachable(client.api.base_url, info, socket.gethostname(), os.geteuid(), os.path.isdir)
    if why_not is None:
        return Route.DIRECT
    if raw == Route.DIRECT.value:
        raise ConfigError(f"{config.SANDBOX_CHANNEL}=direct, but {why_not}; unset it")
    return Route.RELAY


def direct_unreachable(
    base_url: str, info: Mapping[str, Any], hostname: str, euid: int, is_dir: Callable[[str], bool]
) -> str | None:
    """Why a folder of this process's cannot carry the channel to the engine's containers (None when it can): the
    engine must run on this machine, on this file system (``info`` is what ``docker info`` says), and the daemon,
    root in the container, must be the folder's owner (this process is root, or the engine is rootless)."""
    security = " ".join(str(option) for option in info.get("SecurityOptions") or [])
    if base_url != LOCAL_ENGINE_URL:
        return f"the engine is not on a local unix socket ({base_url})"
    if info.get("Name") != hostname:
        return (
            f"the engine runs on another machine or in a VM (it is named {info.get('Name')!r}, this host {hostname!r})"
        )
    if "name=userns" in security:
        return "the engine remaps the containers' users (userns-remap)"
    if euid != 0 and "name=rootless" not in security:
        return "this process is not root and the engine is not rootless"
    if euid != 0 and not is_dir(str(folder_root(euid).parent.parent)):
        return f"this user has no runtime folder ({folder_root(euid).parent.parent})"
    if not is_dir(str(info.get("DockerRootDir") or "")):
        return "the engine's data root is not on this file system"
    return None


def folder_root(euid: int | None = None) -> Path:
    """Where DIRECT channel folders are made: under /run (never a service's private /tmp, which the engine would not
    see), or the user's runtime folder for a rootless engine."""
    euid = os.geteuid() if euid is None else euid
    return Path("/run/terminus-env/channels" if euid == 0 else f"/run/user/{euid}/terminus-env/channels")


class ChannelFolder:
    """One sandbox's DIRECT channel folder: mounted at CHANNEL_DIR, with this process listening on a socket there
    from before the container starts, so the daemon connects as soon as the container is split (nothing waits on a
    poll). The socket goes once the daemon connected; the folder stays, empty, as long as the container: Docker
    copies files into a container only while every mount's source exists. Removed when the channel closes, at exit
    (REGISTRY) or, after a crash, by the reaper: its name starts with its owner's pid and start time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        REGISTRY.add_folder(path)
        self.listener: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # Bound through a descriptor of the folder: the name a socket is bound to shows in /proc/net/unix of
            # every network namespace it serves, the container's included, and the folder's path names this
            # process's pid. Through /proc/self/fd the name says nothing.
            folder = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                self.listener.bind(f"/proc/self/fd/{folder}/channel")
            finally:
                os.close(folder)
            os.chmod(self.socket_path, 0o600)
            self.listener.listen(1)
            self.listener.setblocking(False)
        except BaseException:
            self.remove()
            raise

    @classmethod
    def make(cls, root: Path | None = None) -> ChannelFolder:
        root = folder_root() if root is None else root
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        owner = Owner.current()
        return cls(Path(tempfile.mkdtemp(prefix=f"{owner.pid}-{owner.start}-", dir=root)))  # mode 0700

    @property
    def socket_path(self) -> str:
        return str(self.path / "channel")

    def mount(self) -> Mount:
        return Mount(CHANNEL_DIR, str(self.path), type="bind")

    def stop_listening(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)

    def remove(self) -> None:
        self.stop_listening()
        shutil.rmtree(self.path, ignore_errors=True)
        REGISTRY.discard_folder(self.path)


def reap_folders(root: Path | None = None) -> int:
    """Remove the channel folders of owners that are gone; returns how many."""
    root = folder_root() if root is None else root
    removed = 0
    try:
        entries = list(root.iterdir())
    except OSError:
        return 0
    for entry in entries:
        pid, start, _ = (entry.name.split("-", 2) + ["", ""])[:3]
        if not pid.isdigit() or not Owner(int(pid), start, host_id()).alive():
            shutil.rmtree(entry, ignore_errors=True)
            removed += 1
    return removed


async def _accept(
    client: docker.DockerClient, container_id: str, folder: ChannelFolder, wait_s: float
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Take the daemon's connection on ``folder``'s socket (the folder goes if none comes).

    The wait is for the listener to become readable; the accept itself is a plain non-blocking call of ours, so a
    connection the kernel took is never dropped by a wait that timed out at the same moment. Every ENGINE_CHECK_S
    Docker is asked whether the container still runs (a main process that died at once never connects): not more
    often, as a burst of starts waits on the same engine."""
    listener = folder.listener
    assert listener is not None, "a channel folder listens once"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    next_check = loop.time() + ENGINE_CHECK_S
    try:
        while True:
            try:
                connection, _ = listener.accept()
                break
            except (BlockingIOError, InterruptedError):
                pass
            await _readable(listener, ACCEPT_POLL_S)
            if loop.time() < next_check:
                continue
            if not await asyncio.to_thread(_running, client, container_id):
                raise _stopped_at_once(container_id, "")
            if loop.time() > deadline:
                raise SandboxError(
                    f"the main process of container {container_id[:12]} did not start the sandbox daemon within "
                    f"{wait_s:g} s; if the engine cannot see {folder.path}, set {config.SANDBOX_CHANNEL}=relay"
                )
            next_check = loop.time() + ENGINE_CHECK_S
    except BaseException:
        folder.remove()
        raise
    folder.stop_listening()
    connection.setblocking(False)
    return await asyncio.open_connection(sock=connection)


async def _readable(sock: socket.socket, timeout_s: float) -> None:
    """Return once ``sock`` is readable, or after ``timeout_s``; reads nothing."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(sock.fileno(), wake)
    try:
        await asyncio.wait({ready}, timeout=timeout_s)
    finally:
        loop.remove_reader(sock.fileno())
        ready.cancel()
