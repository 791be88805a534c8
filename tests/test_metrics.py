"""Batch metrics over episode summaries (no Docker)."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from terminus_env.env import EpisodeSummary
from terminus_env.records.metrics import aggregate


def summary(reward=0.0, end="task_complete", format_errors=0, streak=0, truncated=0, turns=3, masked=False):
    return EpisodeSummary(
        task="t",
        reward=reward,
        end_reason=end,
        turns=turns,
        format_errors=format_errors,
        format_error_opening_streak=streak,
        warnings=0,
        truncated_turns=truncated,
        graded=not masked,
        masked=masked,
        rescued=format_errors > 0 and reward > 0,
    )


def test_aggregate_reports_the_seed_figures():
    episodes = [
        summary(reward=1.0, format_errors=1, streak=1, turns=4),  # rescued
        summary(reward=1.0, turns=2),
        summary(reward=0.0, end="format_error", format_errors=2, streak=2, turns=2),
        summary(reward=0.0, end="max_turns", truncated=3, turns=10),
        summary(end="env_error", masked=True, format_errors=5),  # masked from the means
    ]
    m = aggregate(episodes)
    assert m.episodes == 5 and m.env_errors == 1
    assert m.mean_reward == pytest.approx(0.5)
    assert m.mean_format_errors == pytest.approx(0.75)
    assert m.mean_opening_streak == pytest.approx(0.75)
    assert (m.rescued_count, m.rescued_rate) == (1, pytest.approx(0.25))
    assert (m.truncated_turns, m.mean_truncated_turns) == (3, pytest.approx(0.75))
    assert m.mean_turns == pytest.approx(4.5)
    assert m.end_reasons == {"task_complete": 2, "format_error": 1, "max_turns": 1, "env_error": 1}


def test_a_summary_saved_under_the_former_key_is_still_kept_out_of_the_means():
    """Run files written before the flag was named ``masked`` carry ``env_error`` in their summaries."""
    kept = asdict(summary(reward=1.0))
    old = {k: v for k, v in asdict(summary(end="env_error", masked=True, format_errors=5)).items() if k != "masked"}
    m = aggregate([kept, {**old, "env_error": True}])
    assert m.episodes == 2 and m.env_errors == 1 and m.mean_reward == 1.0 and m.mean_format_errors == 0.0


def test_aggregate_reads_info_dicts_and_handles_empty():

    assert aggregate([asdict(summary(reward=1.0))]).mean_reward == 1.0
    empty = aggregate([])
    assert (empty.episodes, empty.mean_reward, empty.rescued_rate) == (0, 0.0, 0.0)
    with pytest.raises(TypeError, match="episode summary"):
        aggregate([42])
