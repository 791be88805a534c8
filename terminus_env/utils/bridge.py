"""Run coroutines from synchronous code, even where an event loop already runs (Jupyter).

Sync wrappers cannot use ``asyncio.run`` inside a notebook, and ``run_until_complete`` fails on a
running loop, so they run coroutines on a loop on a daemon thread. Every sync env of a process
shares one such loop, :func:`shared_loop`: a sandbox's control channel is bound to the loop that
started it, so a warm :class:`~terminus_env.sandbox.SandboxPool` can only serve envs that share
its loop. Create and close such a pool on the same loop (``shared_loop().run(pool.aclose())``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
from collections.abc import Coroutine
from typing import Any, Generic, TypeVar

T = TypeVar("T")
WAKE_S = 0.25
"""How often a waiting sync call wakes to run the signal handlers: a Ctrl-C that lands just before the wait blocks is
otherwise seen only when the call ends (CPython runs Python-level handlers only between bytecodes)."""


class BackgroundLoop:
    """A lazily started event loop on its own daemon thread."""

    def __init__(self, name: str = "terminus-env-loop") -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._pending: set[_Call[Any]] = set()

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._loop

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the background loop and wait for its result.

        When the wait is interrupted (Ctrl-C in a notebook raises KeyboardInterrupt here), ``coro`` is cancelled and
        waited for before the interruption goes on, so nothing of it runs beside the next call (a second Ctrl-C
        stops that wait too)."""
        loop = self._ensure_started()
        if _running_loop() is loop:
            coro.close()
            raise RuntimeError("a sync method was called from inside its own event loop; await the async twin instead")
        call: _Call[T] = _Call(coro)
        try:
            with self._lock:
                self._pending.add(call)
            loop.call_soon_threadsafe(call.start)
            while not call.outcome.done():  # not result(timeout): the coroutine's own TimeoutError must come through
                concurrent.futures.wait([call.outcome], timeout=WAKE_S)
            return call.outcome.result()
        except BaseException:
            call.cancel_and_wait(loop)
            raise
        finally:
            with self._lock:
                self._pending.discard(call)

    def close(self) -> None:
        """Stop the loop and join its thread; safe to call more than once, from any thread.

        A call still waiting in :meth:`run` on another thread gets a RuntimeError instead of waiting for ever.
        """
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
            pending, self._pending = self._pending, set()
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        for call in pending:
            call.abandon(RuntimeError("the background loop was closed while this call waited"))
        if not loop.is_running():
            loop.close()

    def _ensure_started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def serve() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                self._thread = threading.Thread(target=serve, name=self._name, daemon=True)
                self._thread.start()
                ready.wait()
                self._loop = loop
            return self._loop


class _Call(Generic[T]):
    """One coroutine that a thread waits for on the background loop: its outcome, and whether it has ended there.

    ``start`` and ``_cancel`` run on the loop, in the order they were scheduled; the rest runs in the waiting
    thread."""

    def __init__(self, coro: Coroutine[Any, Any, T]) -> None:
        self._coro = coro
        self._task: asyncio.Task[T] | None = None
        self.outcome: concurrent.futures.Future[T] = concurrent.futures.Future()
        self.ended = threading.Event()
        """Set once the coroutine can run no more: it finished, or it never started."""

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._coro)
        self._task.add_done_callback(self._finish)

    def cancel_and_wait(self, loop: asyncio.AbstractEventLoop) -> None:
        """Cancel the coroutine and wait until it has finished cancelling."""
        if self.ended.is_set():
            return
        try:
            loop.call_soon_threadsafe(self._cancel)
        except RuntimeError:  # the loop is closed: nothing runs there any more
            self._coro.close()
            return
        self.ended.wait()

    def abandon(self, error: BaseException) -> None:
        """The loop stopped for good: fail the wait (the coroutine will not run again)."""
        with contextlib.suppress(concurrent.futures.InvalidStateError):
            self.outcome.set_exception(error)
        self.ended.set()

    def _cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
            return
        self._coro.close()  # the interruption came before the coroutine was handed to the loop
        self.ended.set()

    def _finish(self, task: asyncio.Task[T]) -> None:
        self.ended.set()  # first, so that whoever sees the outcome sees the coroutine ended
        with contextlib.suppress(concurrent.futures.InvalidStateError):  # abandoned meanwhile
            if task.cancelled():
                self.outcome.cancel()
            elif task.exception() is not None:
                self.outcome.set_exception(task.exception())  # type: ignore[arg-type]
            else:
                self.outcome.set_result(task.result())


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


_shared: BackgroundLoop | None = None
_shared_lock = threading.Lock()


def shared_loop() -> BackgroundLoop:
    """The process-wide background loop behind every sync env (started on first use, never closed by an env)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = BackgroundLoop("terminus-env-shared-loop")
        return _shared


def _forget_shared_loop() -> None:
    """A forked child has the parent's loop object but not its thread: start afresh there."""
    global _shared, _shared_lock
    _shared, _shared_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_shared_loop)


def close_on_foreign_loop(loop: asyncio.AbstractEventLoop, coro: Any) -> None:
    """Run ``coro`` (a clean-up) on ``loop``, which is not the shared loop: sync ``close()`` of an env whose episode
    an async user started (a Gymnasium wrapper closing it, say). Blocks unless called from inside ``loop``."""
    if loop.is_closed():
        coro.close()
        return
    if loop.is_running():
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            loop.create_task(coro)  # cannot block inside the loop; the close finishes right after
        else:
            asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=60)
        return
    loop.run_until_complete(coro)
