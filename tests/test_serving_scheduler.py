"""The Scheduler: the one admission queue and per-turn path that ServingPool and the benchmark cluster share."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from terminus_env.serving.admission import AdaptiveAdmission, FixedAdmission
from terminus_env.serving.metrics import EngineMetrics
from terminus_env.serving.pool import ServingPool
from terminus_env.serving.router import Router
from terminus_env.serving.scheduler import Scheduler


def scheduler(limit: int, replicas: Sequence[str] = ("a", "b")) -> tuple[Scheduler, list[str]]:
    admitted: list[str] = []
    return Scheduler(Router(list(replicas), "requests"), FixedAdmission(limit)), admitted


def submit(s: Scheduler, admitted: list[str], session: str, group: str | None = None) -> bool:
    return s.submit(session, group, lambda: admitted.append(session))


def test_admits_at_once_while_there_is_room_then_first_in_first_out() -> None:
    s, admitted = scheduler(1)
    assert submit(s, admitted, "first")
    assert [submit(s, admitted, w) for w in ("w1", "w2", "w3")] == [False] * 3
    assert admitted == [] and s.waiting == 3
    for done in ("first", "w1", "w2"):
        s.end(done, 100)
    assert admitted == ["w1", "w2", "w3"] and s.waiting == 0 and s.admission.in_flight == 1


def test_without_admission_control_everything_starts_at_once() -> None:
    s = Scheduler(Router(["a"], "requests"))
    assert all(s.submit(f"s{i}", None, lambda: None) for i in range(100))


def test_waiters_are_admitted_in_the_order_the_controllers_pick_chooses() -> None:
    adm = AdaptiveAdmission(64, 4_000, kv_capacity_tokens=10_000, target_usage=0.8)  # limit 2
    s = Scheduler(Router(["a"], "requests"), adm)
    admitted: list[str] = []
    assert submit(s, admitted, "z/0", "z") and submit(s, admitted, "a/0", "a")
    adm.on_turn("a/0", 9_000)
    s.end("z/0", 1_000)
    assert submit(s, admitted, "y/0", "y")
    assert not submit(s, admitted, "b/0", "b") and not submit(s, admitted, "a/1", "a")
    s.end("y/0", 0)
    assert admitted == ["a/1"]  # its sibling is long; b is unknown (predicted 1000, the mean final)
    s.end("a/0", 9_000)
    assert admitted == ["a/1", "b/0"]


def test_a_waiter_that_withdraws_never_holds_a_slot() -> None:
    s, admitted = scheduler(1)
    submit(s, admitted, "holder")
    submit(s, admitted, "gives-up")
    submit(s, admitted, "next")
    assert s.withdraw("gives-up") and not s.withdraw("gives-up") and not s.withdraw("holder")
    s.end("holder", 10)
    assert admitted == ["next"] and s.admission.in_flight == 1


def test_a_rollout_that_ends_inside_its_admission_lets_the_next_one_in() -> None:
    s, admitted = scheduler(1)
    submit(s, admitted, "holder")
    s.submit("short", None, lambda: (admitted.append("short"), s.end("short", 0)))  # e.g. refused at once
    submit(s, admitted, "after")
    s.end("holder", 10)
    assert admitted == ["short", "after"] and s.admission.in_flight == 1 and s.waiting == 0


def test_the_same_session_cannot_wait_twice() -> None:
    s, admitted = scheduler(1)
    submit(s, admitted, "holder")
    submit(s, admitted, "w")
    with pytest.raises(ValueError, match="already waiting"):
        submit(s, admitted, "w")


def test_each_turn_is_charged_where_it_runs_and_the_end_frees_everything() -> None:
    adm = AdaptiveAdmission(8, 4_000)
    s = Scheduler(Router(["a", "b"], "requests"), adm)
    assert s.submit("s", "g", lambda: None)
    replica = s.place("s", "g")
    assert adm.replica_of("s") == replica and s.router.replica_of("s") == replica
    s.dispatched(replica, "s", 1_000)
    assert s.router.sessions_on(replica) == 1
    s.completed(replica, "s", 1_000, 200)
    assert adm.predict_within_horizon("s") > 1_200  # the live trace is known: 1200 tokens and growing
    s.end("s", 1_200)
    assert adm.in_flight == 0 and adm.replica_of("s") is None and s.router.replica_of("s") is None


def test_a_scrape_that_raises_the_limit_admits_waiters() -> None:
    adm = AdaptiveAdmission(8, 10_000)  # nothing known: limit 1 until the first scrape
    s = Scheduler(Router(["a"], "requests"), adm)
    admitted: list[str] = []
    assert submit(s, admitted, "s0")
    assert not submit(s, admitted, "s1") and not submit(s, admitted, "s2")
    metrics = {"a": EngineMetrics("a", 0, 0, 0.0, 0, 0, 0, 0, 0, 2500, 16)}  # 40k tokens: room for 3 at 0.9
    s.scraped("a", metrics["a"])
    s.observe(metrics)
    assert admitted == ["s1", "s2"] and adm.limit == 3


def test_the_pools_cancelled_waiters_leak_no_slot() -> None:
    """A waiter cancelled in the queue leaves it; one admitted just as it was cancelled gives its slot back."""

    async def main() -> tuple[int, int]:
        adm = FixedAdmission(1)
        pool = ServingPool(["http://127.0.0.1:9"], "m", admission=adm)  # never started: no request is sent
        async with pool.session("holder"):
            waiter = asyncio.create_task(pool.session("gives-up").__aenter__())
            await asyncio.sleep(0)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
        async with pool.session("next"):
            late = asyncio.create_task(pool.session("late").__aenter__())
            await asyncio.sleep(0)
            assert pool.scheduler.waiting == 1
        late.cancel()  # "next" ended: "late" was admitted, but is cancelled before it runs
        with pytest.raises(asyncio.CancelledError):
            await late
        after_race = adm.in_flight
        async with pool.session("last"):
            last = adm.in_flight
        await pool.aclose()
        return after_race, last

    assert asyncio.run(asyncio.wait_for(main(), 10)) == (0, 1)
