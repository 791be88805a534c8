"""The routing benchmark's quick mode: every policy and cap finishes every rollout and the tokens add up."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

from terminus_env.serving.router import POLICIES
from terminus_env.serving.sim.workload import make_workload


def load_bench() -> ModuleType:
    path = Path(__file__).resolve().parent.parent / "bench" / "routing.py"
    spec = importlib.util.spec_from_file_location("bench_routing", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


bench = load_bench()


@pytest.fixture(scope="module")
def quick_runs() -> list:
    return bench.run_matrix([bench.quick_setup()], jobs=1)


def test_every_policy_and_cap_ran(quick_runs: list) -> None:
    expected = {(p, c) for p in POLICIES for c in bench.CAPS} | {(bench.OURS[0], bench.OVERCOMMIT)}
    assert {(r.policy, r.cap) for r in quick_runs} == expected


def test_no_rollout_is_lost_and_token_accounting_adds_up(quick_runs: list) -> None:
    setup = bench.quick_setup()
    batches = make_workload(setup.workload)
    max_len = setup.cluster.engine.max_model_len
    turns = [bench.turn_lengths(p, max_len) for b in batches for p in b]
    expected_requests = sum(len(t) for t in turns)
    expected_output = sum(generated for t in turns for _, generated, _ in t)
    for run in quick_runs:
        r = run.result
        label = (run.policy, run.cap)
        assert r.finished_rollouts == r.rollouts == sum(len(b) for b in batches), label
        assert r.requests == expected_requests, label
        assert r.output_tokens == r.engine_generation_tokens == expected_output, label
        assert len(r.batch_makespans_s) == len(batches) and all(s > 0 for s in r.batch_makespans_s), label
        assert r.makespan_s >= max(r.batch_makespans_s), label
        assert 0 <= r.prefix_hits <= r.prefix_queries, label
        assert r.followup_turns == expected_requests - r.rollouts, label


def test_sticky_policies_keep_every_turn_on_its_replica(quick_runs: list) -> None:
    for run in quick_runs:
        if run.policy != "vllm_internal":
            assert run.result.stay_share == 1.0, (run.policy, run.cap)


def test_the_bound_is_finite_and_no_run_beats_the_longest_rollout_by_much(quick_runs: list) -> None:
    setup = bench.quick_setup()
    batches = make_workload(setup.workload)
    bound = bench.ideal_makespan(batches, setup.cluster)
    assert 0 < bound < math.inf
    longest = max(bench.critical_path(p, setup.cluster.engine) for p in batches[0])
    for run in quick_runs:
        # A rollout alone on a replica is as fast as it can go (a sibling's cached prompt saves < 1 s).
        assert run.result.batch_makespans_s[0] > longest - 1.0, (run.policy, run.cap)


def test_quick_main_prints_the_table_and_the_verdicts(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--quick", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert "ideal bound" in out and "x bound" in out
    assert out.count("decision p50, 64 replicas") == len(POLICIES)
    assert "routing decision <= 50 us p50" in out
