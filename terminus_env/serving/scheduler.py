"""The one path by which rollouts are admitted, placed and accounted.

:class:`~terminus_env.serving.pool.ServingPool` drives its :class:`Router` and :class:`Admission`
controller through a :class:`Scheduler`, and so does the routing benchmark's virtual-time cluster:
the benchmark then measures the decisions production makes, in the order production makes them.
It is synchronous and owns no clock or I/O, so the same object serves an asyncio pool (which turns
``on_admitted`` into a future) and a discrete-event simulation (which starts the rollout's first
turn in it).

Admission order: a rollout is admitted at once while nobody waits and the limit allows; otherwise it
queues, and whenever room opens (a rollout ended, a scrape raised the limit) the controller's
``pick`` chooses among all waiters, in arrival order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from terminus_env.serving.admission import Admission
from terminus_env.serving.metrics import EngineMetrics
from terminus_env.serving.router import Router


@dataclass(frozen=True)
class _Waiter:
    session_id: str
    group_id: str | None
    on_admitted: Callable[[], None]


class Scheduler:
    """Admission queue, placement and per-turn accounting over one router and an optional admission controller."""

    def __init__(self, router: Router, admission: Admission | None = None) -> None:
        self.router = router
        self.admission = admission
        self._waiting: list[_Waiter] = []
        self._waking = False

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    # -- a rollout's life ----------------------------------------------------------------------------

    def submit(self, session_id: str, group_id: str | None, on_admitted: Callable[[], None]) -> bool:
        """Ask to start a rollout: True if it is admitted now (``on_admitted`` is then not called);
        False if it waits, and ``on_admitted()`` is called once it is admitted."""
        if any(w.session_id == session_id for w in self._waiting):
            raise ValueError(f"session {session_id!r} is already waiting for admission")
        if self.admission is None:
            return True
        if not self._waiting and self.admission.try_acquire(session_id, group_id):
            return True
        self._waiting.append(_Waiter(session_id, group_id, on_admitted))
        self._wake()  # the limit may have room that nobody has claimed yet
        return False

    def withdraw(self, session_id: str) -> bool:
        """A waiting rollout gives up: True if it was still waiting (it never held a slot)."""
        for i, waiter in enumerate(self._waiting):
            if waiter.session_id == session_id:
                del self._waiting[i]
                return True
        return False

    def end(self, session_id: str, final_trace_tokens: int) -> None:
        """The rollout is over (``final_trace_tokens`` = 0 if unknown): free its slot and its routing state."""
        if self.admission is not None:
            self.admission.release(session_id, final_trace_tokens)
        self.router.release(session_id)
        self._wake()

    # -- its requests --------------------------------------------------------------------------------

    def place(self, session_id: str, group_id: str | None = None) -> str:
        """The replica for the session's next request; the admission controller charges its KV there."""
        replica = self.router.route(session_id, group_id)
        if self.admission is not None:
            self.admission.on_placed(session_id, replica)
        return replica

    def dispatched(self, replica: str, session_id: str, prompt_tokens: int) -> None:
        self.router.on_dispatch(replica, session_id, prompt_tokens)

    def completed(self, replica: str, session_id: str, prompt_tokens: int, completion_tokens: int) -> None:
        """A turn came back: the router learns the trace, the admission controller its growth."""
        self.router.on_complete(replica, session_id, prompt_tokens, completion_tokens)
        if self.admission is not None:
            self.admission.on_turn(session_id, prompt_tokens + completion_tokens)

    def failed(self, replica: str, session_id: str, prompt_tokens: int) -> None:
        """A request came back without a turn (a replica failure, a refusal, a cancellation)."""
        self.router.on_complete(replica, session_id, prompt_tokens, 0)

    # -- the replicas --------------------------------------------------------------------------------

    def scraped(self, replica: str, metrics: EngineMetrics) -> None:
        """A fresh scrape of one replica."""
        self.router.update_metrics(replica, metrics)

    def observe(self, latest: Mapping[str, EngineMetrics]) -> None:
        """After a round of scrapes: the latest metrics of every replica that is up."""
        if self.admission is not None:
            self.admission.observe(latest)
        self._wake()

    def mark_down(self, replica: str) -> None:
        self.router.mark_down(replica)

    def mark_up(self, replica: str) -> None:
        self.router.mark_up(replica)

    # -- the queue -----------------------------------------------------------------------------------

    def _wake(self) -> None:
        """Admit waiters while the limit allows, in the order the controller's ``pick`` chooses.

        An ``on_admitted`` callback may end a rollout and so re-enter; the outer call keeps going.
        """
        admission = self.admission
        if admission is None or self._waking:
            return
        self._waking = True
        try:
            while self._waiting and admission.in_flight < admission.limit:
                i = admission.pick([(w.session_id, w.group_id) for w in self._waiting])
                waiter = self._waiting[i]
                if not admission.try_acquire(waiter.session_id, waiter.group_id):
                    return
                del self._waiting[i]
                waiter.on_admitted()
        finally:
            self._waking = False
