"""A sandbox host: the Ray actor on one node that owns that node's sandboxes.

It starts them from a spec (building the task's image here first when this node lacks it), runs each terminal
operation, command and verifier run as one call, closes them, and runs the reaper when it starts. Each sandbox is
an ordinary local :class:`Sandbox` on this node, so the speed and the security of a local sandbox hold here. With
``warm_per_spec``, a local :class:`SandboxPool` keeps that many started per spec, so a burst of starts is a burst of
takes (outside the host's slots, ``max_warm`` of them at most).

Its containers' owner is this actor's worker process: when that process dies, SIGKILL included, the kernel closes
its control channels and each container's daemon stops its container (see inside/daemon.py). The class needs no Ray; the
pool makes it an actor (``ray.remote``) and calls its methods.
"""

from __future__ import annotations

import asyncio
import io
import os
import tarfile
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import docker

from terminus_env.sandbox.cleanup import REGISTRY
from terminus_env.sandbox.docker_client import connect
from terminus_env.sandbox.errors import SandboxError, SandboxLost
from terminus_env.sandbox.fleet.placement import HostLimits, host_slots
from terminus_env.sandbox.fleet.wire import Answer, HostInfo, ImageSource, SandboxState, Started, error_to_wire
from terminus_env.sandbox.images import ensure_image
from terminus_env.sandbox.pool import SandboxPool
from terminus_env.sandbox.reaper import reap
from terminus_env.sandbox.sandbox import Sandbox
from terminus_env.sandbox.spec import SandboxSpec

_MB = 1024 * 1024
HOST_NICENESS = 0
"""Ray starts its workers at niceness 15; a host answers terminal operations while its sandboxes compete for the
same cores, so it asks for the default niceness back, where the node lets it (root or CAP_SYS_NICE)."""


class SandboxHost:
    """One node's sandboxes; every method but ``describe`` and ``ping`` answers with an :class:`Answer`."""

    def __init__(
        self, node_id: str, offered: float, limits: HostLimits, warm_per_spec: int = 0, max_warm: int = 0
    ) -> None:
        self._node_id = node_id
        self._slots = host_slots(offered, _cpus(), _memory_mb(), limits)
        self._warm = (warm_per_spec, max_warm)
        self._pool: SandboxPool | None = None  # made with the engine's client
        self._client: docker.DockerClient | None = None
        self._connecting = asyncio.Lock()
        self._sandboxes: dict[str, Sandbox] = {}
        self._starting = 0
        self._images: dict[str, str] = {}  # an ImageSource's key -> the tag it was built into here
        self._builds: dict[str, asyncio.Future[str]] = {}

    async def describe(self) -> HostInfo | Answer:
        """Connect to this node's Docker engine, remove the containers of dead owners, and say what is here
        (an Answer with the error when the engine does not answer)."""
        _renice(HOST_NICENESS)
        try:
            client = await self._docker()
            images = await asyncio.to_thread(_image_tags, client)
        except SandboxError as exc:
            return Answer(error=error_to_wire(exc))
        return HostInfo(self._node_id, os.getpid(), self._slots, _cpus(), _memory_mb(), images)

    async def ping(self) -> int:
        """The number of sandboxes held: the pool's liveness check."""
        return len(self._sandboxes)

    async def start(self, spec: SandboxSpec, source: ImageSource | None) -> Answer:
        """Start a sandbox from ``spec``; with a ``source``, its image is that build context, built here if new."""
        if len(self._sandboxes) + self._starting >= self._slots:
            full = SandboxError(f"this host holds {self._slots} sandboxes already; release one or add hosts")
            return Answer(error=error_to_wire(full))
        self._starting += 1
        try:
            client = await self._docker()
            image = spec.image if source is None else await self._image(source, client)
            sandbox = await self._local_pool(client).acquire(replace(spec, image=image))
        except SandboxError as exc:
            return Answer(error=error_to_wire(exc))
        finally:
            self._starting -= 1
        self._sandboxes[sandbox.id] = sandbox
        return Answer(Started(sandbox.id, image), state=_state(sandbox))

    async def send(self, sandbox_id: str, keystrokes: str, duration: float) -> Answer:
        return await self._on(sandbox_id, lambda s: s.terminal.send(keystrokes, duration))

    async def step(self, sandbox_id: str, commands: list[tuple[str, float]], budget: float | None) -> Answer:
        return await self._on(sandbox_id, lambda s: s.terminal.step(commands, budget))

    async def capture_new(self, sandbox_id: str) -> Answer:
        return await self._on(sandbox_id, lambda s: s.terminal.capture_new())

    async def screen(self, sandbox_id: str) -> Answer:
        return await self._on(sandbox_id, lambda s: s.terminal.screen())

    async def exec(
        self, sandbox_id: str, cmd: str, timeout: float, user: str | None, env: Mapping[str, str] | None,
        workdir: str | None,
    ) -> Answer:  # fmt: skip
        return await self._on(sandbox_id, lambda s: s.exec(cmd, timeout, user=user, env=env, workdir=workdir))

    async def verify(
        self, sandbox_id: str, tests: bytes, cmd: str, timeout: float, user: str, env: Mapping[str, str] | None,
        read: Sequence[str], max_bytes: int, harbor_verdict: bool = False,
    ) -> Answer:  # fmt: skip
        return await self._on(
            sandbox_id, lambda s: s.verify(tests, cmd, timeout, user=user, env=env, read=read, max_bytes=max_bytes,
                                           harbor_verdict=harbor_verdict),
        )  # fmt: skip

    async def read_file(self, sandbox_id: str, path: str, max_bytes: int) -> Answer:
        return await self._on(sandbox_id, lambda s: s.read_file(path, max_bytes))

    async def put_archive(self, sandbox_id: str, data: bytes) -> Answer:
        return await self._on(sandbox_id, lambda s: s.put_archive(data))

    async def stop_agent(self, sandbox_id: str) -> Answer:
        return await self._on(sandbox_id, lambda s: s.stop_agent())

    async def check_disk(self, sandbox_id: str) -> Answer:
        return await self._on(sandbox_id, _check_disk)

    async def lost_to_agent(self, sandbox_id: str) -> Answer:
        return await self._on(sandbox_id, lambda s: s.lost_to_agent())

    async def close(self, sandbox_id: str) -> Answer:
        """Remove the sandbox's container; closing one that is gone already is fine."""
        sandbox = self._sandboxes.pop(sandbox_id, None)
        if sandbox is not None:
            await sandbox.close()  # before answering: the pool frees the slot once the container is gone
            if self._pool is not None:
                await self._pool.release(sandbox)  # the warm pool forgets it (closing it again does nothing)
        return Answer(state=SandboxState(alive=False))

    async def close_all(self) -> int:
        """Remove every container of this host, warm ones too (the pool closes); returns how many were in use."""
        sandboxes, self._sandboxes = list(self._sandboxes.values()), {}
        await asyncio.gather(*(sandbox.close() for sandbox in sandboxes), return_exceptions=True)
        if self._pool is not None:
            await self._pool.aclose()
        return len(sandboxes)

    async def wait_warm(self) -> int:
        """Wait for the warm starts now running; returns how many warm sandboxes this host holds."""
        if self._pool is None:
            return 0
        await self._pool.wait_warm()
        return self._pool.warm_total

    async def _on(self, sandbox_id: str, operation: Callable[[Sandbox], Awaitable[Any]]) -> Answer:
        sandbox = self._sandboxes.get(sandbox_id)
        if sandbox is None:
            lost = SandboxLost(
                f"sandbox {sandbox_id[:12]} is not on this host any more (closed, or its host restarted)"
            )
            return Answer(error=error_to_wire(lost), state=SandboxState(alive=False))
        try:
            value = await operation(sandbox)
        except SandboxError as exc:
            return Answer(error=error_to_wire(exc), state=_state(sandbox, with_stderr=True))
        return Answer(value, state=_state(sandbox))

    async def _docker(self) -> docker.DockerClient:
        async with self._connecting:
            if self._client is None:
                client = await asyncio.to_thread(connect)
                if REGISTRY.claim_reap():  # once per process, before the first sandbox: a predecessor's leftovers
                    await asyncio.to_thread(reap, False, client)
                self._client = client
        return self._client

    def _local_pool(self, client: docker.DockerClient) -> SandboxPool:
        """The pool this host starts its sandboxes from: warm ones per spec, if ``warm_per_spec``."""
        if self._pool is None:
            warm_per_spec, max_warm = self._warm
            self._pool = SandboxPool(warm_per_spec, client=client, max_warm=max_warm)
        return self._pool

    async def _image(self, source: ImageSource, client: docker.DockerClient) -> str:
        """The tag of ``source`` built here: built once per host, however many sandboxes ask at once."""
        tag = self._images.get(source.key)
        if tag is not None:
            return tag
        build = self._builds.get(source.key)
        if build is None:
            build = self._builds[source.key] = asyncio.ensure_future(self._build(source, client))
            build.add_done_callback(lambda _: self._builds.pop(source.key, None))
        return await asyncio.shield(build)

    async def _build(self, source: ImageSource, client: docker.DockerClient) -> str:
        context = await source.context[0]  # fetched from the object store only now, and only here
        tag = await asyncio.to_thread(_build_from, context, source, client)
        self._images[source.key] = tag
        return tag


async def _check_disk(sandbox: Sandbox) -> None:
    await sandbox.check_disk()  # the violation, if any, travels in the answer's state


def _state(sandbox: Sandbox, with_stderr: bool = False) -> SandboxState:
    violation = sandbox.violation
    return SandboxState(
        alive=sandbox.alive,
        violation=None if violation is None else error_to_wire(violation),
        daemon_stderr=sandbox.daemon_stderr if with_stderr else "",
    )


def _build_from(context: bytes, source: ImageSource, client: docker.DockerClient) -> str:
    """Unpack a build context and build it, in one thread: the folder goes only once the build stopped reading it,
    even when the coroutine that asked is cancelled meanwhile."""
    with tempfile.TemporaryDirectory(prefix="terminus-context-") as folder:
        _unpack(context, Path(folder))
        return ensure_image(Path(folder), source.name, source.build_timeout_s, client)


def _unpack(data: bytes, folder: Path) -> None:
    """Unpack a build context as the pool packed it: modes (setuid included) kept, as a local build keeps them."""
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        for member in archive.getmembers():
            if member.name.startswith("/") or ".." in Path(member.name).parts:
                raise SandboxError(f"a build context holds a path outside its folder: {member.name!r}")
        if hasattr(tarfile, "fully_trusted_filter"):  # the pool made this tar from the task's folder
            archive.extractall(folder, filter="fully_trusted")
        else:
            archive.extractall(folder)


def _image_tags(client: docker.DockerClient) -> frozenset[str]:
    return frozenset(
        tag for image in client.api.images() for tag in image.get("RepoTags") or () if tag != "<none>:<none>"
    )


def _renice(niceness: int) -> None:
    """Set every thread of this process to ``niceness`` (Linux keeps one per thread); quietly keep it if refused."""
    for task in Path("/proc/self/task").iterdir():
        try:
            os.setpriority(os.PRIO_PROCESS, int(task.name), niceness)
        except OSError:
            return


def _cpus() -> float:
    return float(len(os.sched_getaffinity(0)))


def _memory_mb() -> float:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / _MB
