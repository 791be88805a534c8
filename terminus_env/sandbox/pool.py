"""A warm pool: containers started ahead of time per spec, so a reset is a take, not a start."""

from __future__ import annotations

import asyncio
from pathlib import Path

import docker

from terminus_env.sandbox.errors import SandboxError
from terminus_env.sandbox.images import ensure_image
from terminus_env.sandbox.sandbox import Sandbox
from terminus_env.sandbox.spec import SandboxSpec


class SandboxPool:
    """Keeps ``warm_per_spec`` started sandboxes per spec; owns every sandbox it starts until released.

    ``max_warm`` caps the warm sandboxes of all specs together (None: no cap): a spec acquired now takes the places
    of the specs acquired longest ago, so a pool that sees many tasks does not keep a warm container for each.

    A container ends at its lifetime, counted from its start however long it sat warm: a warm sandbox is handed out
    only while it has the spec's ``life_needed_s`` left, and removed once it has not.
    """

    def __init__(
        self, warm_per_spec: int = 1, *, client: docker.DockerClient | None = None, max_warm: int | None = None
    ) -> None:
        if warm_per_spec < 0:
            raise ValueError("warm_per_spec must be 0 or more")
        if max_warm is not None and max_warm < 0:
            raise ValueError("max_warm must be 0 or more (or None: no cap)")
        self._warm_per_spec = warm_per_spec
        self._max_warm = max_warm
        self._client = client
        self._warm: dict[SandboxSpec, list[Sandbox]] = {}  # in the order the specs were last acquired
        self._filling: dict[SandboxSpec, set[asyncio.Task[None]]] = {}
        self._in_use: set[Sandbox] = set()
        self._removals: set[asyncio.Task[None]] = set()
        self._closed = False

    async def acquire(self, spec: SandboxSpec) -> Sandbox:
        """A ready sandbox (terminal started): a warm one if any, else a fresh start. Refills in the background.

        A failed background start is not reported; the next cold start raises the same error.
        """
        if self._closed:
            raise SandboxError("this SandboxPool is closed; create a new one")
        sandbox = self._take_warm(spec)
        self._warm[spec] = self._warm.pop(spec, [])  # the most recently acquired spec goes last
        self._refill(spec)
        if sandbox is None:
            sandbox = await Sandbox.start(spec, client=self._client)
        self._in_use.add(sandbox)
        return sandbox

    async def release(self, sandbox: Sandbox) -> None:
        """Hand a sandbox back; it is removed in the background."""
        self._in_use.discard(sandbox)
        self._remove_in_background(sandbox)

    async def aclose(self) -> None:
        """Remove every sandbox this pool started (warm, in use, being removed); safe to call twice."""
        self._closed = True
        fills = [task for tasks in self._filling.values() for task in tasks]
        await asyncio.gather(*fills, return_exceptions=True)
        owned = [sandbox for warm in self._warm.values() for sandbox in warm] + list(self._in_use)
        self._warm.clear()
        self._in_use.clear()
        await asyncio.gather(*(sandbox.close() for sandbox in owned), *self._removals, return_exceptions=True)

    async def __aenter__(self) -> SandboxPool:  # noqa: PYI034 - Python 3.10 has no typing.Self
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def build_image(self, context_dir: Path, name: str, build_timeout_s: float) -> str:
        """Build (or reuse) a task's image on this machine's Docker engine, where this pool's sandboxes run."""
        return await asyncio.to_thread(ensure_image, context_dir, name, build_timeout_s, self._client)

    def warm_count(self, spec: SandboxSpec) -> int:
        return len(self._warm.get(spec, []))

    @property
    def warm_total(self) -> int:
        """Warm sandboxes of every spec."""
        return sum(len(warm) for warm in self._warm.values())

    async def wait_warm(self) -> None:
        """Wait until the background starts now running have finished (for benchmarks and tests)."""
        await asyncio.gather(*(task for tasks in self._filling.values() for task in tasks), return_exceptions=True)

    def _take_warm(self, spec: SandboxSpec) -> Sandbox | None:
        warm = self._warm.get(spec, [])
        while warm:
            sandbox = warm.pop(0)
            if sandbox.alive and sandbox.life_left_s >= spec.effective_life_needed_s:
                return sandbox
            self._remove_in_background(sandbox)
        return None

    def _remove_in_background(self, sandbox: Sandbox) -> None:
        task = asyncio.get_running_loop().create_task(sandbox.close())
        self._removals.add(task)
        task.add_done_callback(self._removals.discard)

    def _refill(self, spec: SandboxSpec) -> None:
        filling = self._filling.setdefault(spec, set())
        missing = self._warm_per_spec - len(self._warm.get(spec, [])) - len(filling)
        if self._max_warm is not None and missing > 0:
            missing = min(missing, self._make_room(spec, missing, self._max_warm))
        for _ in range(max(missing, 0)):
            task = asyncio.get_running_loop().create_task(self._fill(spec))
            filling.add(task)
            task.add_done_callback(filling.discard)

    def _make_room(self, spec: SandboxSpec, wanted: int, cap: int) -> int:
        """Free up to ``wanted`` warm places for ``spec`` under ``cap``, removing the warm sandboxes of the specs
        acquired longest ago; returns how many places there are."""
        held = sum(len(warm) for warm in self._warm.values()) + sum(len(tasks) for tasks in self._filling.values())
        for other in list(self._warm):
            if cap - held >= wanted or other == spec:
                break
            while self._warm[other] and cap - held < wanted:
                self._remove_in_background(self._warm[other].pop())
                held -= 1
        return max(cap - held, 0)

    async def _fill(self, spec: SandboxSpec) -> None:
        try:
            sandbox = await Sandbox.start(spec, client=self._client)
        except SandboxError:
            return
        if self._closed:
            await sandbox.close()
        else:
            self._warm.setdefault(spec, []).append(sandbox)
