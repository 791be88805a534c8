"""pass@k and the leaderboard's score and confidence interval, checked against first principles."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from terminus_env.records.stats import Trial, pass_at_k, report, task_score


@given(st.integers(1, 9).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_is_the_share_of_k_subsets_holding_a_success(nck: tuple[int, int, int]) -> None:
    # The unbiased estimator is exactly: over every way to pick k of the n trials, how often one was solved.
    n, c, k = nck
    outcomes = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(outcomes, k))
    assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))


def test_pass_at_k_rejects_impossible_counts() -> None:
    for n, c, k in [(3, 4, 1), (3, 1, 4), (3, 1, 0), (0, 0, 1)]:
        with pytest.raises(ValueError, match="pass@k"):
            pass_at_k(n, c, k)


def test_the_score_is_the_leaderboard_mean_of_task_means_with_its_standard_error() -> None:
    # Two tasks: rewards (1, 0, 1) and (0, 0, 0, 1) -> p = 2/3 and 1/4.
    trials = [Trial("a", r, "task_complete") for r in (1, 0, 1)]
    trials += [Trial("b", r, "task_complete") for r in (0, 0, 0, 1)]
    result = report(trials, k=3)
    overall = result.overall
    assert overall.mean_reward == pytest.approx((2 / 3 + 1 / 4) / 2)
    # The leaderboard's SQL: sqrt(sum(p(1-p)/(n-1))) / T, computed here by hand.
    expected_se = math.sqrt((2 / 3) * (1 / 3) / 2 + (1 / 4) * (3 / 4) / 3) / 2
    assert overall.stderr == pytest.approx(expected_se)
    low, high = overall.ci95
    mean = overall.mean_reward
    assert (low, high) == pytest.approx((mean - 1.96 * expected_se, mean + 1.96 * expected_se))
    a, b = result.tasks
    assert (a.pass_at_1, a.pass_at_k) == pytest.approx((2 / 3, 1.0))
    assert b.pass_at_1 == pytest.approx(1 / 4) and b.pass_at_k == pytest.approx(1 - math.comb(3, 3) / math.comb(4, 3))
    assert overall.pass_at_k == pytest.approx((a.pass_at_k + b.pass_at_k) / 2) and overall.pass_at_k_tasks == 2


def test_invalid_trials_are_left_out_and_a_task_without_any_is_listed_unscored() -> None:
    trials = [
        Trial("a", 1.0, "task_complete", category="git"),
        Trial("a", 0.0, "env_error", valid=False, category="git"),
        Trial("a", 0.0, "agent_timeout", category="git"),
        Trial("broken", 0.0, "load_error", valid=False),
        Trial("broken", 0.0, "load_error", valid=False),
    ]
    result = report(trials, k=2, task_order=["broken", "a"])
    assert [t.task for t in result.tasks] == ["broken", "a"]
    broken, a = result.tasks
    assert (a.trials, a.invalid, a.solved, a.mean_reward) == (2, 1, 1, 0.5)
    assert (broken.trials, broken.mean_reward, broken.pass_at_1) == (0, None, None)
    assert result.overall.tasks == 1 and result.overall.unscored == ("broken",)
    assert result.end_reasons == {"load_error": 2, "task_complete": 1, "env_error": 1, "agent_timeout": 1}
    assert a.end_reasons == {"agent_timeout": 1, "env_error": 1, "task_complete": 1}
    assert set(result.categories) == {"git", "-"} and result.categories["-"].tasks == 0
    assert (result.rollouts, result.invalid) == (5, 3)


def test_one_trial_per_task_gives_no_interval_as_on_the_leaderboard() -> None:
    result = report([Trial("a", 1.0, "task_complete"), Trial("b", 0.0, "task_complete")], k=1)
    assert result.overall.mean_reward == 0.5 and result.overall.stderr is None and result.overall.ci95 is None
    assert task_score("a", [Trial("a", 1.0, "x")], 1).variance_term is None


def test_the_interval_is_clipped_to_zero_and_one() -> None:
    trials = [Trial("a", r, "task_complete") for r in (1, 1, 0)]
    low, high = report(trials, k=1).overall.ci95
    assert low >= 0.0 and high == 1.0


def test_the_95_percent_interval_covers_the_true_score_about_95_percent_of_the_time() -> None:
    # Simulated benchmarks with known per-task success rates: the interval is only worth showing if it
    # covers the true mean at close to its nominal rate (the normal approximation runs a little low).
    rng = random.Random(11)
    rates = [rng.uniform(0.05, 0.95) for _ in range(40)]
    truth = sum(rates) / len(rates)
    runs, covered = 1500, 0
    for _ in range(runs):
        trials = [Trial(f"t{i}", float(rng.random() < p), "end") for i, p in enumerate(rates) for _ in range(5)]
        low, high = report(trials, k=5).overall.ci95
        covered += low <= truth <= high
    assert 0.91 <= covered / runs <= 0.98
