"""One hardened container per episode, driven through a single control channel.

Created through the docker-py API with a cut-down capability set, no network unless the
spec allows it, pids/memory/CPU limits, ``init``, no-new-privileges, owner labels and a
lifetime backstop (the main process is ``sleep lifetime_s``; the container removes itself
when it ends). Removed on close, at exit, on SIGTERM, when the owner dies (the agent sees
its channel close) and, failing all that, by the reaper.
"""

from __future__ import annotations

import asyncio
import base64
import io
import math
import tarfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import docker
from docker.errors import APIError, ImageNotFound

from terminus_env.sandbox.channel import Channel
from terminus_env.sandbox.cleanup import REGISTRY, remove_container
from terminus_env.sandbox.engine import connect
from terminus_env.sandbox.errors import SandboxError
from terminus_env.sandbox.owner import Owner, new_run_id
from terminus_env.sandbox.reaper import reap
from terminus_env.sandbox.spec import SandboxSpec
from terminus_env.sandbox.terminal import Terminal, TerminalOutput
from terminus_env.sandbox.text import join_capped

__all__ = ["ExecResult", "Sandbox", "Terminal", "TerminalOutput"]

EXEC_OUTPUT_LIMIT = 1_000_000
_GRACE_S = 30.0  # how much longer than a command's own timeout the host waits for the agent


@dataclass
class ExecResult:
    exit_code: int  # 124 when the timeout killed the command
    output: str  # stdout and stderr together, capped at EXEC_OUTPUT_LIMIT bytes
    timed_out: bool
    duration_s: float


class Sandbox:
    """One container with a tmux terminal; create with ``await Sandbox.start(spec)``."""

    def __init__(
        self, spec: SandboxSpec, client: docker.DockerClient, container_id: str, channel: Channel,
        terminal: Terminal, user: str | None,
    ) -> None:  # fmt: skip
        self.spec = spec
        self.id = container_id
        self.terminal = terminal
        self._client = client
        self._channel = channel
        self._user = user
        self._closed = False

    @classmethod
    async def start(cls, spec: SandboxSpec, *, client: docker.DockerClient | None = None) -> Sandbox:
        REGISTRY.hook()
        client = await asyncio.to_thread(connect, client)
        if REGISTRY.claim_reap():
            await asyncio.to_thread(reap, False, client)
        creating = asyncio.ensure_future(asyncio.to_thread(_create, client, spec))
        try:
            container_id, image_user = await asyncio.shield(creating)
        except asyncio.CancelledError:  # the thread still finishes; remove what it makes
            creating.add_done_callback(lambda done: done.exception() or _discard(client, done.result()[0]))
            raise
        try:
            user = spec.user or image_user or None
            channel = await Channel.open(client, container_id)
            terminal = await Terminal.start(channel, user=user, workdir=spec.workdir)
        except BaseException:
            await asyncio.to_thread(_discard, client, container_id)
            raise
        return cls(spec, client, container_id, channel, terminal, user)

    async def exec(
        self, cmd: str, timeout: float, *, user: str | None = None, env: Mapping[str, str] | None = None,
        workdir: str | None = None,
    ) -> ExecResult:  # fmt: skip
        """Run ``bash -c cmd`` outside the terminal; on timeout everything it started is killed in the container."""
        reply = await self._channel.request(
            "exec", timeout + _GRACE_S, cmd=cmd, timeout=timeout, user=user or self._user, env=dict(env or {}),
            workdir=workdir or self.spec.workdir, max_output=EXEC_OUTPUT_LIMIT,
        )  # fmt: skip
        output = join_capped(reply["head"], reply["tail"], reply["omitted"], EXEC_OUTPUT_LIMIT)
        return ExecResult(reply["exit_code"], output, reply["timed_out"], reply["duration_s"])

    async def put_dir(self, local: Path, dest: str) -> None:
        """Copy the contents of folder ``local`` into ``dest`` (created if missing)."""
        local = Path(local)
        if not local.is_dir():
            raise SandboxError(f"put_dir: {local} is not a folder; pass the folder whose contents to copy")
        await asyncio.to_thread(self._put_archive, _tar_dir(local, dest))

    async def put_file(self, data: bytes, dest: str, mode: int = 0o644) -> None:
        """Write ``data`` to the file ``dest`` (parent folders are created)."""
        await asyncio.to_thread(self._put_archive, _tar_file(data, dest, mode))

    async def read_file(self, path: str, max_bytes: int = 1_000_000) -> bytes | None:
        """The file's first ``max_bytes`` bytes, or None if it does not exist."""
        reply = await self._channel.request("read", _GRACE_S, path=path, max_bytes=max_bytes)
        return None if reply["data"] is None else base64.b64decode(reply["data"])

    async def close(self) -> None:
        """Remove the container; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(_discard, self._client, self.id)
        await self._channel.close()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def alive(self) -> bool:
        """Not closed, and its control channel (hence its container) is still up."""
        return not self._closed and not self._channel.closed

    async def __aenter__(self) -> Sandbox:  # noqa: PYI034 - Python 3.10 has no typing.Self
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _put_archive(self, data: bytes) -> None:
        try:
            self._client.api.put_archive(self.id, "/", data)
        except APIError as exc:
            raise SandboxError(f"copying into sandbox {self.id[:12]} failed: {exc}") from exc


def _create(client: docker.DockerClient, spec: SandboxSpec) -> tuple[str, str]:
    """Create and start the container; returns its id and the image's default user."""
    limit_mb = spec.effective_memory_mb
    try:
        container = client.containers.create(  # create, not run: run would try to pull a missing image
            spec.image,
            entrypoint=["sleep"],
            command=[str(math.ceil(spec.lifetime_s))],
            auto_remove=True,
            init=True,
            labels=Owner.current().labels(new_run_id()),
            network_mode=None if spec.allow_internet else "none",
            cap_drop=["ALL"],
            cap_add=list(spec.capabilities),
            security_opt=["no-new-privileges"],
            pids_limit=spec.pids_limit,
            mem_limit=f"{limit_mb}m",
            memswap_limit=f"{limit_mb}m",
            nano_cpus=int(spec.effective_cpus * 1e9),
            environment=dict(spec.env),
            working_dir=spec.workdir,
        )
    except ImageNotFound as exc:
        raise SandboxError(
            f"image {spec.image!r} does not exist here; build it (ensure_image, or `terminus-env images base`)"
        ) from exc
    except APIError as exc:
        raise SandboxError(f"cannot create a container from {spec.image!r}: {exc.explanation or exc}") from exc
    REGISTRY.add(container.id, client)
    try:
        container.start()
    except APIError as exc:
        _discard(client, container.id)
        raise SandboxError(f"cannot start a container from {spec.image!r}: {exc.explanation or exc}") from exc
    return container.id, container.attrs.get("Config", {}).get("User") or ""


def _discard(client: docker.DockerClient, container_id: str) -> None:
    remove_container(client, container_id)
    REGISTRY.discard(container_id)


def _tar_dir(local: Path, dest: str) -> bytes:
    buffer = io.BytesIO()
    root = PurePosixPath("/", dest).relative_to("/")
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path in sorted(local.rglob("*")):
            archive.add(path, arcname=str(root / path.relative_to(local).as_posix()), recursive=False)
    return buffer.getvalue()


def _tar_file(data: bytes, dest: str, mode: int) -> bytes:
    buffer = io.BytesIO()
    info = tarfile.TarInfo(str(PurePosixPath("/", dest).relative_to("/")))
    info.size, info.mode, info.mtime = len(data), mode, int(time.time())
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()
