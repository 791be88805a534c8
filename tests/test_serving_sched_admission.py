"""Fixed and adaptive admission: the counting, the order waiters are picked in, and how the adaptive limit moves."""

from __future__ import annotations

import dataclasses

import pytest

from terminus_env.serving.admission import AdaptiveAdmission, FixedAdmission
from terminus_env.serving.metrics import EngineMetrics

CAPACITY = 100_000  # tokens over all replicas in these tests (two engines of 3125 blocks × 16)


def scrape(preemptions: float = 0.0) -> dict[str, EngineMetrics]:
    return {
        name: EngineMetrics(
            engine=name, num_requests_running=0, num_requests_waiting=0, kv_cache_usage=0.0,
            num_preemptions_total=preemptions / 2, prompt_tokens_total=0, generation_tokens_total=0,
            prefix_cache_queries_total=0, prefix_cache_hits_total=0, num_gpu_blocks=3125, block_size=16,
        )
        for name in ("0", "1")
    }


def adaptive(**kwargs: object) -> AdaptiveAdmission:
    defaults: dict[str, object] = {"target_usage": 0.8, "patience": 3, "deadband": 0.05}
    defaults.update(kwargs)
    return AdaptiveAdmission(64, 4_000, **defaults)  # type: ignore[arg-type]


def observe(adm: AdaptiveAdmission, times: int, preemptions: float = 0.0) -> None:
    for _ in range(times):
        adm.observe(scrape(preemptions))


def test_fixed_counts_against_its_limit() -> None:
    adm = FixedAdmission(2)
    assert adm.try_acquire("a") and adm.try_acquire("b")
    assert not adm.try_acquire("c")
    adm.release("a", 1000)
    adm.release("a", 1000)  # a second release of the same session changes nothing
    assert adm.in_flight == 1
    assert adm.try_acquire("c")
    with pytest.raises(ValueError, match="already admitted"):
        adm.try_acquire("c")


def test_fixed_from_capacity_uses_the_concurrency_rule() -> None:
    # min(pipeline 64, floor(10 traces/rank × 4 ranks × 0.9)) = 36
    assert FixedAdmission.from_capacity(64, per_rank=10, dp=4).limit == 36
    assert FixedAdmission.from_capacity(16, per_rank=10, dp=4).limit == 16
    with pytest.raises(ValueError):
        FixedAdmission(0)


def test_adaptive_starts_from_the_prior_and_never_exceeds_the_pipeline_cap() -> None:
    adm = AdaptiveAdmission(64, 4_000, kv_capacity_tokens=CAPACITY, target_usage=0.8)
    assert adm.limit == 20  # 0.8 × 100000 / 4000
    assert AdaptiveAdmission(64, 4_000, kv_capacity_tokens=100 * CAPACITY).limit == 64
    small_pipeline = AdaptiveAdmission(10, 4_000, target_usage=0.8)
    observe(small_pipeline, 5)  # the KV would allow 20
    assert small_pipeline.limit == 10


def test_adaptive_learns_capacity_from_the_first_scrape() -> None:
    adm = adaptive()
    assert adm.limit == 1  # nothing known yet
    observe(adm, 1)
    assert adm.limit == 20  # the first capacity figure is taken at once


def test_adaptive_shrinks_as_live_traces_grow_and_grows_when_they_finish() -> None:
    adm = adaptive()
    observe(adm, 3)
    for i in range(20):
        assert adm.try_acquire(f"s{i}")
    for i in range(20):
        adm.on_turn(f"s{i}", 4_000)  # each now predicted at max(prior, 1.25 × 4000) = 5000
    observe(adm, 3)
    assert adm.limit == 15  # 20 + floor((80000 - 100000) / 4000)
    assert not adm.try_acquire("late")
    for i in range(12):
        adm.release(f"s{i}", 6_000)  # finished traces now say a rollout ends near 6000 tokens
    assert adm.in_flight == 8
    observe(adm, 3)
    # 8 live at 4000 each predicted 6000 (the mean of finished traces >= 4000): 48000 committed;
    # room = floor(32000 / 6000) = 5 -> 13
    assert adm.limit == 13
    assert adm.try_acquire("late")


def test_adaptive_never_cancels_work_in_flight() -> None:
    adm = adaptive()
    observe(adm, 3)
    for i in range(20):
        adm.try_acquire(f"s{i}")
        adm.on_turn(f"s{i}", 20_000)
    observe(adm, 3)
    assert adm.limit < adm.in_flight == 20  # over budget: nothing new, nothing dropped


def test_adaptive_uses_finished_siblings_first() -> None:
    adm = adaptive()
    observe(adm, 3)
    for i in range(3):
        adm.try_acquire(f"g/{i}", "g")
    adm.try_acquire("other", "h")
    adm.release("g/0", 12_000)
    adm.on_turn("g/1", 3_000)
    adm.on_turn("other", 3_000)
    assert adm.predict_final("g/1") == 12_000  # its sibling ended at 12000
    assert adm.predict_final("other") == 12_000  # no sibling: finished rollouts at least 3000 long
    adm.release("x-never-admitted", 500)  # ignored
    adm.try_acquire("h/2", "h")
    adm.release("other", 2_000)
    adm.on_turn("h/2", 1_000)
    assert adm.predict_final("h/2") == 2_000


def test_adaptive_backs_off_at_once_on_preemptions_and_recovers_slowly() -> None:
    adm = adaptive(recover_after=3, recover_step=0.1)
    observe(adm, 3)
    assert adm.limit == 20
    observe(adm, 1, preemptions=0)
    observe(adm, 1, preemptions=4)  # the counters rose: target × 0.8 right away
    assert adm.target_scale == pytest.approx(0.8)
    assert adm.limit == 16
    observe(adm, 2, preemptions=4)  # quiet again (the counter did not move), but not for long enough
    assert adm.target_scale == pytest.approx(0.8) and adm.limit == 16
    observe(adm, 5, preemptions=4)
    assert adm.target_scale == pytest.approx(1.0)
    observe(adm, 3, preemptions=4)  # the limit is not binding: no overcommit past 1.0
    assert adm.target_scale == pytest.approx(1.0)
    assert adm.limit == 20


def test_adaptive_overcommits_only_while_binding_and_pinned_kv_is_low() -> None:
    def scrape_at(usage: float) -> dict[str, EngineMetrics]:
        return {k: dataclasses.replace(m, kv_cache_usage=usage) for k, m in scrape().items()}

    adm = adaptive(max_target_scale=1.5, recover_after=1, recover_step=0.1)
    observe(adm, 1)
    while adm.try_acquire(f"s{adm.in_flight}"):
        pass
    assert adm.in_flight == adm.limit == 20
    for _ in range(3):
        adm.observe(scrape_at(0.95))  # binding, but the engines' KV is pinned: stay at 1.0
    assert adm.target_scale == 1.0
    for _ in range(12):  # rollouts keep queueing: every raise is used at once
        adm.observe(scrape_at(0.30))
        while adm.try_acquire(f"s{adm.in_flight}"):
            pass
    assert adm.target_scale == pytest.approx(1.5)  # capped at max_target_scale
    assert adm.limit == 30  # 1.5 × 0.8 × 100000 / 4000
    adm.observe(scrape(preemptions=2))
    assert adm.target_scale == pytest.approx(1.2) and adm.limit == 24  # in flight stays 30: nothing cancelled
    assert adm.in_flight == 30


def test_adaptive_hysteresis_ignores_a_one_scrape_burst_and_small_moves() -> None:
    adm = adaptive()
    observe(adm, 3)
    for i in range(10):
        adm.try_acquire(f"s{i}")
        adm.on_turn(f"s{i}", 4_000)
    # committed 50000 -> desired 10 + floor(30000/4000) = 17, a real move: needs 3 scrapes in a row
    observe(adm, 2)
    assert adm.limit == 20
    for i in range(10):
        adm.on_turn(f"s{i}", 1_000)  # the burst passes: predictions back at the prior (4000)
    observe(adm, 1)
    assert adm.desired_limit() == 20 and adm.limit == 20
    adm.on_turn("s0", 4_400)  # 5500 predicted: desired 19, inside the deadband
    observe(adm, 5)
    assert adm.limit == 20


def test_adaptive_refuses_bad_settings() -> None:
    with pytest.raises(ValueError, match="min_limit"):
        AdaptiveAdmission(4, 1000, min_limit=5)
    with pytest.raises(ValueError, match="prior_trace_tokens"):
        AdaptiveAdmission(4, 0)


def test_horizon_budgets_the_next_turns_not_whole_rollouts() -> None:
    def run(horizon: float | None) -> AdaptiveAdmission:
        adm = adaptive(horizon_turns=horizon)
        observe(adm, 1)
        for i in range(10):
            adm.try_acquire(f"s{i}")
            adm.on_turn(f"s{i}", 2_000)  # first turn
            adm.on_turn(f"s{i}", 3_000)  # one turn later: +1000
        for i in range(4):
            adm.release(f"s{i}", 20_000)  # finished rollouts were long
        return adm

    near = run(2)
    # each live rollout is predicted to end at 20000, but two turns ahead it holds 3000 + 2 × 1000
    assert near.predict_final("s5") == 20_000 and near.predict_within_horizon("s5") == 5_000
    # a new one: first turn 2000 + one turn of growth; room = floor((80000 - 6 × 5000) / 3000) = 16
    assert near.expected_new_trace() == 3_000
    assert near.desired_limit() == 6 + 16
    whole = run(None)  # every live trace at its predicted final: 120000 > 80000 committed
    assert whole.predict_within_horizon("s5") == 20_000 and whole.expected_new_trace() == 20_000
    assert whole.desired_limit() == 6 + (80_000 - 120_000) // 20_000


def test_horizon_never_predicts_past_the_final_trace() -> None:
    adm = adaptive(horizon_turns=50)
    observe(adm, 1)
    adm.try_acquire("a")
    adm.on_turn("a", 1_000)
    adm.on_turn("a", 2_000)
    assert adm.predict_within_horizon("a") == adm.predict_final("a") == 4_000  # the prior
    with pytest.raises(ValueError, match="horizon_turns"):
        AdaptiveAdmission(4, 1000, horizon_turns=0)


def test_longest_first_picks_the_group_predicted_longest_and_reveals_unknown_groups_one_each() -> None:
    adm = adaptive()
    observe(adm, 1)
    for session, group in (("a/0", "a"), ("b/0", "b"), ("x/0", "x")):
        adm.try_acquire(session, group)
    adm.on_turn("a/0", 9_000)  # group a is already longer than any rollout ends on average
    adm.release("b/0", 1_000)  # group b ended short
    adm.release("x/0", 7_000)  # mean final trace: 4000, what an unknown group is predicted
    waiting = [("b/1", "b"), ("c/0", "c"), ("c/1", "c"), ("a/1", "a"), ("d/0", "d")]
    assert adm.pick(waiting) == 3  # a: 9000 > unknown c, d: 4000 > b: 1000
    del waiting[3]
    assert adm.pick(waiting) == 1  # c/0: unknown, as early as d/0
    adm.try_acquire("c/0", "c")
    del waiting[1]
    assert waiting[adm.pick(waiting)] == ("d/0", "d")  # c has a sibling running: d reveals its length first
    assert adaptive(longest_first=False).pick(waiting) == 0  # plain FIFO


def test_turn_statistics_follow_the_recent_window() -> None:
    adm = adaptive(history=2, horizon_turns=1)
    observe(adm, 1)
    for session, first in (("a", 1_000), ("b", 2_000), ("c", 3_000)):
        adm.try_acquire(session)
        adm.on_turn(session, first)
    assert adm.expected_new_trace() == 2_500  # the last two first-turn traces; one turn ahead is the first


def scrape_by_replica(preemptions: dict[str, float]) -> dict[str, EngineMetrics]:
    return {name: dataclasses.replace(m, num_preemptions_total=preemptions.get(name, 0.0))
            for name, m in scrape().items()}


def test_a_replica_over_budget_does_not_hold_back_admission_onto_an_idle_one() -> None:
    adm = adaptive()
    observe(adm, 1)  # two replicas of 50000 tokens: 40000 each to budget
    for i in range(8):
        adm.try_acquire(f"s{i}")
        adm.on_placed(f"s{i}", "0")
        adm.on_turn(f"s{i}", 6_000)  # each predicted at max(prior, 1.25 × 6000) = 7500: 60000 on "0"
    assert adm.replica_of("s0") == "0" and adm.replica_of("nobody") is None
    # "1" is empty: floor(40000 / 4000) new rollouts fit there. One pooled budget would give
    # 8 + floor((80000 - 60000) / 4000) = 13.
    assert adm.desired_limit() == 18
    for i in range(8, 16):
        adm.try_acquire(f"s{i}")
        adm.on_placed(f"s{i}", "1")
        adm.on_turn(f"s{i}", 6_000)
    # Now no replica has room: the deficit counts, so finishing rollouts do not let new ones in.
    assert adm.desired_limit() == 16 + (80_000 - 120_000) // 4_000
    adm.on_placed("s15", "0")  # a failover or a move charges the new replica
    assert adm.replica_of("s15") == "0"
    adm.release("s15", 7_000)
    assert adm.replica_of("s15") is None


def test_sessions_not_placed_yet_are_charged_against_the_room_left() -> None:
    adm = adaptive()
    observe(adm, 1)
    for i in range(4):
        adm.try_acquire(f"s{i}")
        adm.on_turn(f"s{i}", 6_000)  # 4 × 7500 predicted, not placed (a caller that never says where)
    assert adm.desired_limit() == 4 + (80_000 - 30_000) // 4_000


def test_preemptions_back_off_only_the_replica_that_preempted() -> None:
    adm = adaptive(recover_after=3)
    adm.observe(scrape_by_replica({}))
    assert adm.limit == 20
    adm.observe(scrape_by_replica({"0": 3}))
    assert adm.target_scale == pytest.approx(0.8)  # the most backed-off replica's factor
    assert adm.limit == (0.8 * 0.8 * 50_000 + 0.8 * 50_000) // 4_000  # 18; a pooled backoff gave 16
