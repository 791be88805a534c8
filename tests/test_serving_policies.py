"""Placement policies as objects: the registry, and a policy of one's own plugged into the Router."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from terminus_env.serving.metrics import EngineMetrics
from terminus_env.serving.policies import (
    POLICIES,
    SATURATED,
    AvailableKV,
    LeastLoaded,
    Placement,
    Policy,
    ReplicaState,
    RoundRobin,
    make_policy,
)
from terminus_env.serving.router import Router


def em(usage: float, engine: str = "0") -> EngineMetrics:
    return EngineMetrics(engine, 0, 0, usage, 0, 0, 0, 0, 0, 4096, 16)


class Busiest(LeastLoaded):
    """A deliberately odd rule, so a test can tell it from every built-in one: the fullest replica wins."""

    name = "busiest"
    kv_units = True

    def loads(self, up: Sequence[ReplicaState], placement: Placement) -> list[float]:
        return [SATURATED if r.metrics is None else 1.0 - r.metrics.kv_cache_usage for r in up]


class FirstEveryTime(Policy):
    name = "first"
    sticky = False

    def choose(self, up: Sequence[ReplicaState], placement: Placement) -> ReplicaState:
        return up[0]


def test_every_name_makes_a_fresh_policy_object_of_that_name() -> None:
    assert POLICIES == (
        "requests", "active_kv", "available_kv", "round_robin", "least_requests", "vllm_internal", "consistent_hash",
    )
    for name in POLICIES:
        a, b = make_policy(name), make_policy(name)
        assert isinstance(a, Policy) and a.name == name and a is not b
    assert [make_policy(n).sticky for n in POLICIES].count(False) == 1  # vllm_internal only
    with pytest.raises(ValueError, match="unknown routing policy 'fastest'; choose one of requests"):
        make_policy("fastest")


def test_group_settings_reach_the_load_policies() -> None:
    policy = make_policy("available_kv", group_affinity=True, group_slack=0.2)
    assert isinstance(policy, AvailableKV) and policy.group_affinity and policy.group_slack == 0.2
    assert isinstance(make_policy("round_robin", group_affinity=True), RoundRobin)  # ignores load: nothing to set
    with pytest.raises(ValueError, match="group_slack"):
        make_policy("requests", group_slack=-1)


def test_a_policy_object_of_ones_own_places_new_sessions_and_the_router_keeps_them_sticky() -> None:
    r = Router(["a", "b", "c"], Busiest(), clock=lambda: 0.0)
    for name, usage in (("a", 0.2), ("b", 0.7), ("c", 0.4)):
        r.update_metrics(name, em(usage))
    assert r.policy.name == "busiest"
    assert r.route("s") == "b"
    r.update_metrics("c", em(0.9))
    assert r.route("s") == "b"  # sticky: placed once
    assert r.route("t") == "c" and r.sessions_on("c") == 1


def test_stale_metrics_fall_back_to_session_counts_for_any_load_policy() -> None:
    r = Router(["a", "b"], Busiest(), clock=lambda: 100.0, metrics_max_age_s=5.0)
    r.route("s1")  # no scrape at all: counts decide, the tie goes by hash
    assert r.route("s2") != r.replica_of("s1")


def test_a_policy_that_is_not_sticky_places_every_request_and_cannot_be_rebalanced() -> None:
    r = Router(["a", "b"], FirstEveryTime())
    assert [r.route("s"), r.route("s")] == ["a", "a"] and r.replica_of("s") is None and r.sessions_on("a") == 0
    with pytest.raises(ValueError, match="first places every request afresh"):
        Router(["a", "b"], FirstEveryTime(), rebalance=True)


def test_group_affinity_follows_siblings_within_the_slack() -> None:
    policy = make_policy("available_kv", group_affinity=True, group_slack=0.1)
    up = [ReplicaState("a", 0), ReplicaState("b", 1)]
    for r, usage in zip(up, (0.30, 0.25)):
        r.metrics, r.capacity, r.scraped_at = em(usage), 65536, 0.0
    alone = Placement(session_key=7, siblings={}, fresh_since=-1.0, turn_growth=0.0)
    assert policy.choose(up, alone).name == "b"
    with_siblings = Placement(session_key=7, siblings={"a": 3}, fresh_since=-1.0, turn_growth=0.0)
    assert policy.choose(up, with_siblings).name == "a"  # 0.30 is within 0.1 of 0.25
    up[0].metrics = em(0.50)
    assert policy.choose(up, with_siblings).name == "b"  # no longer
