"""GRPO groups sampled on two real replicas through TRL's rollout function: no sample of a group is a copy.

vLLM's default seed is the same in every replica, and replicas fed requests in the same order draw the same random
numbers: a group spread over them then held copies (in strict evals with two trials, both trials of every task were
the same, token for token). ``terminus-env serve`` gives each replica its own seed, and a per-request ``seed``
becomes one per rollout and turn, so a group stays diverse either way.
"""

from __future__ import annotations

import pytest
from vllm_support import MODEL_NAME

from terminus_env.integrations.trl import make_rollout_func
from terminus_env.rollout.policy import request_seed
from terminus_env.tasks import find_task

pytestmark = pytest.mark.usefixtures("docker_required")
TASKS = ("hello-world", "csv-to-json")
GROUP = 8


def first_turns(fleet, sampling: dict):
    """One batch of two GRPO groups of 8 (TRL hands each prompt over 8 times in a row); each rollout's first turn."""
    tasks = [find_task(name) for name in TASKS]
    with make_rollout_func(tasks, base_urls=fleet.urls, model=MODEL_NAME, max_tokens=24, sampling=sampling,
                           max_sandboxes=8) as rollouts:  # fmt: skip
        rollouts([name for name in TASKS for _ in range(GROUP)], None)
    return [(t.group_id, t.turns[0]) for t in rollouts.last_trajectories]


@pytest.mark.parametrize("sampling", [{"temperature": 1.0}, {"temperature": 1.0, "seed": 3}], ids=["serve", "request"])
def test_groups_of_8_on_2_replicas_at_temperature_1_hold_no_two_same_completions(fleet, sampling):
    seeds = [line.rsplit("seed ", 1)[1].rstrip(")") for line in fleet.lines if line.startswith("  http://")]
    assert seeds == ["0", "1"]  # what serve gave each replica
    turns = first_turns(fleet, sampling)
    groups = {group for group, _ in turns}
    assert len(turns) == 2 * GROUP and len(groups) == 2
    for group in groups:
        members = [turn for g, turn in turns if g == group]
        assert {turn.replica for turn in members} == set(fleet.urls)  # each group was spread over both replicas
    completions = [tuple(turn.token_ids) for _, turn in turns]
    assert all(len(c) > 0 for c in completions)
    assert len(set(completions)) == len(completions), "a batch holds copies"
    openings = [c[:4] for c in completions]
    assert len(set(openings)) > len(openings) // 2  # not even the same openings across tasks
    if "seed" in sampling:  # each request's seed derived from the base, the rollout and the turn, and recorded
        sent = [turn.sampling["seed"] for _, turn in turns]
        assert len(set(sent)) == len(sent) and all(isinstance(s, int) for s in sent)
        assert request_seed(3, "r", 0) == request_seed(3, "r", 0) != request_seed(3, "r", 1)
