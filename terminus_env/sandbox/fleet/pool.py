"""``RaySandboxPool``: sandboxes on the nodes of a Ray cluster, with the interface of :class:`SandboxPool`.

Nodes offer themselves with the custom resource ``terminus_sandbox_host`` (its amount: the node's sandbox slots),
so GPU nodes need not host sandboxes. The pool starts one host actor on each such node (pinned there, holding the
node's whole amount), places each new sandbox by the rules in ``placement``, and ships each task's build context
to the object store once, for the hosts that have to build its image.

Faults: a host whose actor or node dies is lost as soon as Ray says so (a SIGKILLed worker: milliseconds; a killed
node: when its worker notices, about 3 s here) or when it misses the liveness check (``ping_interval_s`` apart, each
allowed ``ping_timeout_s``): every episode on it then ends in ``SandboxLost`` (``env_error``) within
``FleetConfig.loss_bound_s``, 12 s by default. A node that offers the resource again gets a new host within
``refresh_s``.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from terminus_env.sandbox.errors import SandboxError, SandboxLost
from terminus_env.sandbox.fleet.host import SandboxHost
from terminus_env.sandbox.fleet.link import HostLink
from terminus_env.sandbox.fleet.placement import HostLimits, place
from terminus_env.sandbox.fleet.remote import CALL_MARGIN_S, RemoteSandbox
from terminus_env.sandbox.fleet.wire import Answer, HostInfo, ImageSource, error_from_wire
from terminus_env.sandbox.images import context_hash, context_tar, slug
from terminus_env.sandbox.spec import SandboxSpec

RESOURCE = "terminus_sandbox_host"
"""The custom resource a node offers sandboxes by; its amount is the node's slots."""
BUILD_CONTEXT = "build-context://"
"""Prefix of the image name a task gets from this pool: its build context, built on the host that runs it."""
START_S = 300.0
"""How long a sandbox's start may take on its host, image builds aside (under load, with the hand-over)."""
HOST_CALLS = 10_000
"""Calls one host actor serves at once; far above its slots, since each sandbox has few calls in flight."""
OFFER_LINE = "ray start --address=HEAD:6379 --resources='{\"terminus_sandbox_host\": 16}'"


@dataclass(frozen=True)
class FleetConfig:
    """How the pool finds hosts, watches them, and waits for slots."""

    limits: HostLimits = field(default_factory=HostLimits)
    ping_interval_s: float = 2.0
    ping_timeout_s: float = 10.0
    refresh_s: float = 10.0
    """How often the pool looks for nodes without a host (new ones, and ones whose host died)."""
    host_start_s: float = 120.0
    slot_wait_s: float = 600.0
    """How long ``acquire`` waits for a free slot when every host is full."""
    runtime_env: Mapping[str, Any] | None = None
    """Ray's runtime environment for the host actors, when nodes lack terminus-env (e.g. ``py_modules``)."""
    warm_per_spec: int = 0
    """Sandboxes each host keeps started per spec it has started (as ``SandboxPool(warm_per_spec)``), so a batch's
    burst of starts of one spec is a burst of takes. They wait outside the host's slots."""
    max_warm: int = 64
    """The most warm sandboxes one host keeps, of all specs together (the specs acquired longest ago give way)."""

    def __post_init__(self) -> None:
        for name in ("ping_interval_s", "ping_timeout_s", "refresh_s", "host_start_s", "slot_wait_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"FleetConfig.{name} must be positive, got {getattr(self, name)}")
        for name in ("warm_per_spec", "max_warm"):
            if getattr(self, name) < 0:
                raise ValueError(f"FleetConfig.{name} must be 0 or more, got {getattr(self, name)}")

    @property
    def loss_bound_s(self) -> float:
        """The longest a dead host's episodes wait before they end: one interval, then a missed check."""
        return self.ping_interval_s + self.ping_timeout_s


class RaySandboxPool:
    """Sandboxes on a Ray cluster's nodes: ``acquire(spec)``, ``release(sandbox)``, ``aclose()``, as SandboxPool.

    ``address`` is what ``ray.init(address=...)`` takes; None joins the Ray this process already runs in (a
    trainer's), or lets ``ray.init`` decide. Use one pool per cluster: its hosts hold the nodes' slots.
    """

    def __init__(self, address: str | None = None, config: FleetConfig | None = None) -> None:
        self._config = config or FleetConfig()
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            ray.init(address=address)
        self._actor = ray.remote(SandboxHost)
        self._hosts: dict[str, HostLink] = {}
        self._host_starts: dict[str, asyncio.Task[None]] = {}
        self._problems: dict[str, str] = {}  # node id -> why no host runs there
        self._sources: dict[str, ImageSource] = {}
        self._in_use: set[RemoteSandbox] = set()
        self._background: set[asyncio.Task[Any]] = set()
        self._changed: asyncio.Event | None = None
        self._started: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None
        self._heartbeats: set[asyncio.Task[None]] = set()
        self._closed = False

    # ----- the SandboxPool interface ----------------------------------------------------------
    async def acquire(self, spec: SandboxSpec) -> RemoteSandbox:
        """A started sandbox on the host chosen by ``placement.place``; waits up to ``slot_wait_s`` for a slot."""
        await self.start()
        source = self._sources.get(spec.image)
        link = await self._reserve(spec.image)
        starting = asyncio.ensure_future(link.call("start", self._start_wait(source), spec, source))
        try:
            answer: Answer = await asyncio.shield(starting)
        except asyncio.CancelledError:
            starting.add_done_callback(lambda done: self._discard_start(link, done))
            raise
        except BaseException:
            self._free(link)
            raise
        if answer.error is not None:
            self._free(link)
            raise error_from_wire(answer.error)
        sandbox = RemoteSandbox(link, spec, answer.value, answer.state, self._sandbox_closed)
        self._in_use.add(sandbox)
        return sandbox

    async def release(self, sandbox: RemoteSandbox) -> None:
        """Hand a sandbox back; its container is removed in the background and its slot freed after."""
        self._in_use.discard(sandbox)
        self._spawn(sandbox.close())

    async def aclose(self) -> None:
        """Remove every sandbox of this pool on every host, then stop the hosts; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        watchers = [task for task in (self._watch, *self._heartbeats, *self._host_starts.values()) if task is not None]
        for task in watchers:
            task.cancel()
        await asyncio.gather(*watchers, *self._background, return_exceptions=True)
        await asyncio.gather(*(sandbox.close() for sandbox in list(self._in_use)), return_exceptions=True)
        links = list(self._hosts.values())  # close_all: what is left, e.g. a start whose caller was cancelled
        await asyncio.gather(*(link.call("close_all", START_S) for link in links), return_exceptions=True)
        for link in links:
            _kill(link.handle)
        self._hosts.clear()
        self._in_use.clear()
        if self._owns_ray:
            ray.shutdown()

    async def __aenter__(self) -> RaySandboxPool:  # noqa: PYI034 - Python 3.10 has no typing.Self
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def build_image(self, context_dir: Path, name: str, build_timeout_s: float) -> str:
        """The image name for a task's build context: the context goes to the object store once, and the host
        that runs the task builds it there (or finds it built)."""
        key = await asyncio.to_thread(context_hash, Path(context_dir))
        image = f"{BUILD_CONTEXT}{slug(name)}/{key}"
        if image not in self._sources:
            data = await asyncio.to_thread(_pack, Path(context_dir))
            self._sources[image] = ImageSource(key, name, build_timeout_s, [ray.put(data)])
        return image

    # ----- hosts --------------------------------------------------------------------------------
    async def start(self) -> None:
        """Find the nodes that offer the resource and start a host on each (done once; acquire does it too).

        Raises SandboxError, saying how to offer slots, when no host could start.
        """
        if self._closed:
            raise SandboxError("this RaySandboxPool is closed; create a new one")
        if self._started is None:
            self._changed = asyncio.Event()
            self._started = asyncio.ensure_future(self._discover(wait=True))
        await asyncio.shield(self._started)
        if self._watch is None:
            self._watch = asyncio.ensure_future(self._watch_hosts())
            if not self._hosts:
                raise SandboxError(self._no_hosts())

    async def refresh(self) -> None:
        """Look for nodes without a host now (the pool also does so every ``refresh_s``)."""
        await self.start()
        await self._discover(wait=True)

    @property
    def hosts(self) -> list[HostLink]:
        """The live hosts, in the order they joined."""
        return list(self._hosts.values())

    @property
    def in_use(self) -> list[RemoteSandbox]:
        """The sandboxes acquired and not yet released."""
        return list(self._in_use)

    async def wait_warm(self) -> int:
        """Wait until every host's warm starts now running have finished; returns the warm sandboxes held in all
        (for benchmarks and tests)."""
        await self.start()
        counts = await asyncio.gather(*(link.call("wait_warm", START_S) for link in self._hosts.values()))
        return sum(counts)

    def describe(self) -> list[tuple[HostInfo, int, set[str]]]:
        """Each live host, its slots in use and the images it has or builds (for logs and tests)."""
        return [(link.info, link.load.used, set(link.load.images)) for link in self._hosts.values()]

    async def _discover(self, wait: bool) -> None:
        """Start a host on every live node that offers the resource and has none; with ``wait``, wait for those
        starts (not for older ones: a node that just died still looks alive for a while, and its start hangs)."""
        nodes = await asyncio.to_thread(ray.nodes)
        started = []
        for node in nodes:
            node_id, offered = node["NodeID"], float(node.get("Resources", {}).get(RESOURCE, 0))
            if not node.get("Alive") or offered <= 0 or node_id in self._hosts or node_id in self._host_starts:
                continue
            task = asyncio.ensure_future(self._start_host(node_id, offered))
            self._host_starts[node_id] = task
            task.add_done_callback(functools.partial(self._host_started, node_id))
            started.append(task)
        if wait:
            await asyncio.gather(*started, return_exceptions=True)

    def _host_started(self, node_id: str, _: asyncio.Future[None]) -> None:
        self._host_starts.pop(node_id, None)

    async def _start_host(self, node_id: str, offered: float) -> None:
        handle: Any = self._actor.options(
            num_cpus=0, resources={RESOURCE: offered}, max_restarts=0, max_concurrency=HOST_CALLS,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            **({"runtime_env": dict(self._config.runtime_env)} if self._config.runtime_env else {}),
        ).remote(node_id, offered, self._config.limits, self._config.warm_per_spec, self._config.max_warm)  # fmt: skip
        try:
            described = await asyncio.wait_for(handle.describe.remote(), self._config.host_start_s)
        except asyncio.CancelledError:
            _kill(handle)
            raise
        except (RayError, asyncio.TimeoutError) as exc:
            _kill(handle)
            self._problems[node_id] = (
                f"its host did not start within {self._config.host_start_s:g} s ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else 'no detail'}); is its {RESOURCE} amount held by "
                "another pool, or terminus-env missing there?"
            )
            return
        if isinstance(described, Answer):  # the host could not reach its node's Docker engine
            _kill(handle)
            self._problems[node_id] = str(error_from_wire(described.error)) if described.error else "no answer"
            return
        if self._closed:
            _kill(handle)
            return
        self._problems.pop(node_id, None)
        link = self._hosts[node_id] = HostLink(handle, described, self._host_lost)
        heartbeat = asyncio.ensure_future(self._heartbeat(link))
        self._heartbeats.add(heartbeat)
        heartbeat.add_done_callback(self._heartbeats.discard)
        self._notify()

    def _host_lost(self, link: HostLink) -> None:
        if self._hosts.get(link.info.node_id) is link:
            del self._hosts[link.info.node_id]
        self._problems[link.info.node_id] = link.lost_reason
        _kill(link.handle)  # a host that missed its checks but lives must not keep containers no one drives
        self._notify()

    async def _watch_hosts(self) -> None:
        """Look for nodes without a host (new ones, and ones whose host died) every ``refresh_s``."""
        while True:
            await asyncio.sleep(self._config.refresh_s)
            try:
                await self._discover(wait=False)
            except RayError as exc:  # the head did not answer this time; try again next round
                self._problems["head"] = f"listing the nodes failed: {exc}"

    async def _heartbeat(self, link: HostLink) -> None:
        """Check one host every ``ping_interval_s``: one that does not answer within ``ping_timeout_s`` is lost."""
        while not link.lost:
            await asyncio.sleep(self._config.ping_interval_s)
            try:
                await link.call("ping", self._config.ping_timeout_s)
            except SandboxLost:
                return  # lost already: _host_lost ran
            except SandboxError:
                link.lose(f"no answer to the liveness check within {self._config.ping_timeout_s:g} s")

    # ----- slots --------------------------------------------------------------------------------
    async def _reserve(self, image: str) -> HostLink:
        deadline = time.monotonic() + self._config.slot_wait_s
        while True:
            links = list(self._hosts.values())
            if not links and not self._host_starts:
                await self._discover(wait=True)
                links = list(self._hosts.values())
                if not links:
                    raise SandboxError(self._no_hosts())
            index = place([link.load for link in links], image)
            if index is not None:
                link = links[index]
                link.load.used += 1
                link.load.images.add(image)
                return link
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                slots = sum(link.load.slots for link in links)
                raise SandboxError(
                    f"no sandbox slot came free within {self._config.slot_wait_s:g} s ({len(links)} hosts, {slots} "
                    f"slots, all in use); add nodes (`{OFFER_LINE}`) or run fewer episodes at once"
                )
            changed = self._changed
            assert changed is not None
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except asyncio.TimeoutError:
                pass

    def _free(self, link: HostLink) -> None:
        link.load.used = max(0, link.load.used - 1)
        self._notify()

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    def _sandbox_closed(self, sandbox: RemoteSandbox) -> None:
        self._in_use.discard(sandbox)
        self._free(sandbox.host)

    def _discard_start(self, link: HostLink, done: asyncio.Future[Answer]) -> None:
        """A start whose caller was cancelled: remove what it made and free its slot."""
        answer = None if done.cancelled() or done.exception() else done.result()
        if answer is not None and answer.error is None:
            self._spawn(link.call("close", START_S, answer.value.sandbox_id))
        self._free(link)

    def _start_wait(self, source: ImageSource | None) -> float:
        return START_S + (source.build_timeout_s if source else 0.0) + CALL_MARGIN_S

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(lambda done: done.cancelled() or done.exception())

    def _no_hosts(self) -> str:
        why = "; ".join(f"node {node[:12]}: {problem}" for node, problem in self._problems.items())
        return (
            f"no sandbox host runs on this Ray cluster: no live node offers the resource {RESOURCE!r}"
            + (f", or its host failed ({why})" if why else "")
            + f". Offer a node's slots with `{OFFER_LINE}`"
        )


def _pack(context_dir: Path) -> bytes:
    with context_tar(context_dir) as archive:
        return archive.read()


def _kill(handle: Any) -> None:
    try:
        ray.kill(handle, no_restart=True)
    except (RayError, ValueError):
        pass  # gone already
