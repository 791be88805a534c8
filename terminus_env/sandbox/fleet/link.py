"""One host actor as the pool sees it: calls with a deadline, and the host's loss turned into ``SandboxLost``.

A host is lost when Ray reports its actor dead or unreachable (its worker process or its node died), or when it
misses the pool's liveness check. From that moment every call in flight to it fails at once with SandboxLost (an
infrastructure fault, masked as ``env_error``), and so does every later call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ray.exceptions import RayError, RayTaskError

from terminus_env.sandbox.errors import SandboxError, SandboxLost
from terminus_env.sandbox.fleet.placement import HostLoad
from terminus_env.sandbox.fleet.wire import HostInfo


class HostLink:
    """A host actor's handle, what it said about itself, and the pool's count of its slots in use."""

    def __init__(self, handle: Any, info: HostInfo, on_lost: Callable[[HostLink], None]) -> None:
        self.handle = handle
        self.info = info
        self.load = HostLoad(info.slots, images=set(info.images))
        self._on_lost = on_lost
        self._lost: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    @property
    def name(self) -> str:
        return f"the sandbox host on node {self.info.node_id[:12]} (pid {self.info.pid})"

    @property
    def lost(self) -> bool:
        return self._lost.done()

    @property
    def lost_reason(self) -> str:
        return self._lost.result() if self._lost.done() else ""

    def lose(self, reason: str) -> None:
        """Declare the host gone: calls in flight and later calls raise SandboxLost with ``reason``."""
        if self._lost.done():
            return
        self._lost.set_result(
            f"{self.name} is gone ({reason}); its containers stop with it. Start a new episode: the pool places it "
            "on a live host"
        )
        self._on_lost(self)

    async def call(self, method: str, wait_s: float, *args: Any) -> Any:
        """One actor call; SandboxLost if the host is or becomes lost, SandboxError if no answer within ``wait_s``."""
        if self._lost.done():
            raise SandboxLost(self._lost.result())
        reply = asyncio.wrap_future(getattr(self.handle, method).remote(*args).future())
        try:
            await asyncio.wait((reply, self._lost), timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not reply.done():
                reply.add_done_callback(_retrieve)  # nobody awaits it any more: no "never retrieved" warning
        if reply.done():
            try:
                return reply.result()
            except RayTaskError as exc:  # the method itself raised: a bug of ours, not a lost host
                raise SandboxError(f"{self.name} failed on {method!r}: {exc}") from exc
            except RayError as exc:
                self.lose(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
                raise SandboxLost(self._lost.result()) from exc
        if self._lost.done():
            raise SandboxLost(self._lost.result())
        raise SandboxError(f"{self.name} did not answer {method!r} within {wait_s:g} s; close this sandbox")


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
