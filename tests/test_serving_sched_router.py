"""Router placement with hand-made EngineMetrics and a hand-driven clock."""

from __future__ import annotations

import pytest

from terminus_env.serving.metrics import EngineMetrics
from terminus_env.serving.router import (
    POLICIES,
    NoReplicaAvailable,
    Router,
    UnknownReplica,
)

CAPACITY_BLOCKS = 4096  # × 16 = 65536 tokens per replica


def em(usage: float = 0.0, running: float = 0.0, waiting: float = 0.0, engine: str = "0") -> EngineMetrics:
    return EngineMetrics(
        engine=engine, num_requests_running=running, num_requests_waiting=waiting, kv_cache_usage=usage,
        num_preemptions_total=0, prompt_tokens_total=0, generation_tokens_total=0, prefix_cache_queries_total=0,
        prefix_cache_hits_total=0, num_gpu_blocks=CAPACITY_BLOCKS, block_size=16,
    )


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def router(policy: str, **kwargs: object) -> tuple[Router, Clock]:
    clock = Clock()
    r = Router(["a", "b", "c"], policy, clock=clock, **kwargs)  # type: ignore[arg-type]
    return r, clock


def scrape(r: Router, **metrics: EngineMetrics) -> None:
    for name, m in metrics.items():
        r.update_metrics(name, m)


def turn(r: Router, session: str, prompt: int, completion: int, group: str | None = None) -> str:
    replica = r.route(session, group)
    r.on_dispatch(replica, session, prompt)
    r.on_complete(replica, session, prompt, completion)
    return replica


def test_active_kv_picks_the_smallest_live_footprint() -> None:
    r, _ = router("active_kv")
    scrape(r, a=em(0.5), b=em(0.2), c=em(0.3))
    assert r.route("s") == "b"


def test_active_kv_counts_dispatches_the_scrape_has_not_seen() -> None:
    r, _ = router("active_kv")
    scrape(r, a=em(0.30), b=em(0.20), c=em(0.25))
    first = r.route("s1")
    assert first == "b"
    r.on_dispatch("b", "s1", 13_000)  # 13000 / 65536 = 0.198 on top of b's 0.20
    assert r.route("s2") == "c"
    scrape(r, b=em(0.20))  # the scrape now includes it (pretend it finished): b is lightest again
    assert r.route("s3") == "b"


def test_a_completion_takes_back_exactly_what_its_dispatch_counted() -> None:
    r, _ = router("active_kv")
    scrape(r, a=em(0.10), b=em(0.10), c=em(0.45))
    home = r.route("s")
    r.on_dispatch(home, "s", 30_000)  # an estimate; the server later reports 6000 real prompt tokens
    r.on_complete(home, "s", 6_000, 100)
    other = ({"a", "b"} - {home}).pop()
    scrape(r, **{other: em(0.12)})  # were 24000 tokens left counted on home, it would now lose
    assert r.route("t") == home


def test_available_kv_reserves_what_idle_sticky_sessions_will_claim_again() -> None:
    # "a" shows the lowest usage because its one session is waiting on a tool: its 20k-token trace is
    # only evictable cache now. active_kv sends the next session there; available_kv does not.
    for policy, expected in (("active_kv", "a"), ("available_kv", "b")):
        r, _ = router(policy, turn_growth_prior_tokens=0)
        r.mark_down("b"), r.mark_down("c")
        assert turn(r, "long", 18_000, 2_000) == "a"
        r.mark_up("b"), r.mark_up("c")
        # a: 1 - 0.10 - 20000/65536 = 0.59 available; b: 0.75; c: 0.60
        scrape(r, a=em(0.10), b=em(0.25), c=em(0.40))
        assert r.route("next") == expected, policy


def test_available_kv_expects_live_sessions_to_grow() -> None:
    for prior, expected in ((0, ["a", "a"]), (8_000, ["a", "b"])):
        r, _ = router("available_kv", turn_growth_prior_tokens=prior)
        scrape(r, a=em(0.10), b=em(0.15), c=em(0.5))
        # With growth expected, the first session's 8000 tokens (0.12) make "a" fuller than "b".
        assert [r.route("s1"), r.route("s2")] == expected, prior


def test_requests_counts_idle_sessions_and_least_requests_only_in_flight() -> None:
    for policy in ("requests", "least_requests"):
        r = Router(["a", "b"], policy)
        r.mark_down("b")
        r.route("idle1"), r.route("idle2")  # two sessions on "a", both between turns
        r.mark_up("b")
        r.mark_down("a")
        r.route("busy")  # one session on "b" with a request in flight
        r.on_dispatch("b", "busy", 100)
        r.mark_up("a")
        chosen = r.route("new")
        assert chosen == ("b" if policy == "requests" else "a"), policy


def test_vllm_internal_scores_waiting_four_times_and_is_not_sticky() -> None:
    r, _ = router("vllm_internal")
    scrape(r, a=em(running=0, waiting=1), b=em(running=3, waiting=0), c=em(running=5, waiting=0))
    assert r.route("s") == "b"  # 3 < 4 < 5
    scrape(r, b=em(running=9))
    assert r.route("s") == "a"  # not sticky: the same session moves
    r.on_dispatch("a", "s", 10)  # counted as waiting until scraped: a = 4 + 4
    assert r.route("t") == "c"


def test_round_robin_cycles_and_sticks() -> None:
    r, _ = router("round_robin")
    assert [r.route(f"s{i}") for i in range(4)] == ["a", "b", "c", "a"]
    assert r.route("s1") == "b"


def test_consistent_hash_is_deterministic_and_moves_only_a_down_replicas_sessions() -> None:
    r1, _ = router("consistent_hash")
    r2, _ = router("consistent_hash")
    sessions = [f"s{i}" for i in range(60)]
    homes = {s: r1.route(s) for s in sessions}
    assert homes == {s: r2.route(s) for s in sessions}
    assert set(homes.values()) == {"a", "b", "c"}
    r1.mark_down("a")
    moved = {s: r1.route(s) for s in sessions}
    for s in sessions:
        if homes[s] == "a":
            assert moved[s] in ("b", "c")
        else:
            assert moved[s] == homes[s]


@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "vllm_internal"])
def test_sessions_stay_put_even_when_their_replica_becomes_busiest(policy: str) -> None:
    r, _ = router(policy)
    scrape(r, a=em(0.1), b=em(0.1), c=em(0.1))
    home = r.route("s")
    r.on_dispatch(home, "s", 5000)
    scrape(r, **{n: em(0.95 if n == home else 0.0, running=50 if n == home else 0) for n in "abc"})
    for _ in range(3):
        assert r.route("s") == home
    r.on_complete(home, "s", 5000, 100)
    assert r.route("s") == home


def test_release_forgets_the_session_and_its_load() -> None:
    r, _ = router("requests")
    home = r.route("s")
    assert r.sessions_on(home) == 1
    r.release("s")
    r.release("s")  # idempotent
    assert r.sessions_on(home) == 0 and r.replica_of("s") is None


def test_stale_metrics_count_as_saturated() -> None:
    r, clock = router("active_kv", metrics_max_age_s=5.0)
    scrape(r, a=em(0.05))
    clock.t += 6.0
    scrape(r, b=em(0.6), c=em(0.7))
    assert r.route("s1") == "b"  # a's 0.05 is 6 s old: treated as full


def test_when_every_replica_is_stale_the_routers_own_counts_decide() -> None:
    r, clock = router("available_kv", metrics_max_age_s=5.0)
    scrape(r, a=em(0.0), b=em(0.0), c=em(0.0))
    clock.t += 10.0
    placed = [r.route(f"s{i}") for i in range(3)]
    assert sorted(placed) == ["a", "b", "c"]


def test_down_replica_sessions_move_on_their_next_call_and_come_back_later() -> None:
    r, _ = router("requests")
    home = r.route("s")
    r.mark_down(home)
    moved = r.route("s")
    assert moved != home
    assert r.route("s") == moved
    r.mark_up(home)
    assert r.route("s") == moved  # sticky to where it lives now
    assert r.route("fresh") == home  # the empty replica takes new sessions again


def test_all_down_is_a_clear_error() -> None:
    r, _ = router("available_kv")
    for n in "abc":
        r.mark_down(n)
    with pytest.raises(NoReplicaAvailable, match="mark one up"):
        r.route("s")


def test_group_affinity_keeps_siblings_together_while_there_is_room() -> None:
    r, _ = router("active_kv", group_affinity=True, group_slack=0.1)
    scrape(r, a=em(0.20), b=em(0.10), c=em(0.15))
    first = r.route("g/0", "g")
    assert first == "b"
    scrape(r, b=em(0.18))  # b is no longer the lightest, but within 0.1 of the best (c's 0.15)
    assert r.route("g/1", "g") == "b"
    assert r.route("other", "h") == "c"
    scrape(r, b=em(0.40))  # no room: the next sibling goes to the lightest replica
    assert r.route("g/2", "g") == "c"


def test_without_group_affinity_siblings_spread_by_load() -> None:
    r, _ = router("active_kv")
    scrape(r, a=em(0.20), b=em(0.10), c=em(0.15))
    r.route("g/0", "g")
    scrape(r, b=em(0.18))
    assert r.route("g/1", "g") == "c"


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown routing policy"):
        Router(["a"], "fastest")
    with pytest.raises(ValueError, match="unique"):
        Router(["a", "a"])
    r, _ = router("requests")
    with pytest.raises(UnknownReplica, match="knows a, b, c"):
        r.on_dispatch("z", "s", 1)


@pytest.mark.parametrize("policy", ["available_kv", "least_requests"])
def test_rebalance_moves_a_session_between_turns_off_a_saturated_replica(policy: str) -> None:
    r, _ = router(policy, rebalance=True, rebalance_after_turns=2, turn_growth_prior_tokens=0)
    r.mark_down("b"), r.mark_down("c")
    home = turn(r, "s", 20_000, 1_000)
    r.mark_up("b"), r.mark_up("c")
    assert home == "a"
    # a: 0.95 pinned + s's own 21000-token trace (0.32) = 1.27 >= 1.0; c with s's trace would be 0.37
    scrape(r, a=em(0.95), b=em(0.40), c=em(0.05))
    r.on_dispatch(r.route("s"), "s", 21_000)  # turn 2 stays: one turn done there, the cooldown is two
    assert r.route("s") == "a"  # a request in flight is never moved
    r.on_complete("a", "s", 21_000, 500)
    assert r.route("s") == "c" and r.migrations == 1  # turn 3 moves to the emptiest replica
    assert r.replica_of("s") == "c" and r.sessions_on("a") == 0 and r.sessions_on("c") == 1
    assert r.route("s") == "c"  # the cooldown starts again on its new home


def test_rebalance_needs_a_saturated_home_and_a_clear_margin() -> None:
    for a_usage, others in ((0.60, 0.0), (0.95, 0.80)):
        r, _ = router("available_kv", rebalance=True, rebalance_after_turns=0, turn_growth_prior_tokens=0)
        scrape(r, a=em(0.1), b=em(0.2), c=em(0.3))
        assert turn(r, "s", 20_000, 1_000) == "a"
        scrape(r, a=em(a_usage), b=em(others), c=em(others))
        # a at 0.60 + 0.32 is not saturated; at 0.95 + 0.32 = 1.27 the others would be 1.12: too close
        assert [r.route("s") for _ in range(3)] == ["a"] * 3 and r.migrations == 0


def test_rebalance_is_off_by_default_and_only_for_sticky_policies() -> None:
    assert Router(["a"]).rebalance is False
    with pytest.raises(ValueError, match="vllm_internal places every request afresh"):
        Router(["a", "b"], "vllm_internal", rebalance=True)
