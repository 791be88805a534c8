"""The routing benchmark's quick mode: every policy and cap finishes every rollout and the tokens add up."""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import pytest
import routing as bench
from routing_lab.workload import make_workload

from terminus_env.serving.router import POLICIES


@pytest.fixture(scope="module")
def quick_runs() -> list:
    return bench.run_matrix([bench.quick_setup()], jobs=1)


def test_every_policy_and_cap_ran(quick_runs: list) -> None:
    expected = {(p, c) for p in POLICIES for c in bench.CAPS} | {(bench.OURS[0], cap) for cap in bench.EXTRA}
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


def test_synchronous_steps_run_back_to_back() -> None:
    result = bench.run_one("available_kv", "fixed", bench.quick_setup(async_steps=1)).result
    assert result.finished_rollouts == result.rollouts
    ends = [start + span for start, span in zip(result.batch_starts_s, result.batch_makespans_s)]
    assert result.batch_starts_s[0] == 0.0
    assert result.batch_starts_s[1:] == pytest.approx(ends[:-1])  # each step starts when the previous ends
    assert result.makespan_s == pytest.approx(sum(result.batch_makespans_s))


def test_async_steps_release_a_step_once_fewer_than_k_are_unfinished() -> None:
    setup = bench.quick_setup(async_steps=2)
    setup = dataclasses.replace(setup, workload=dataclasses.replace(setup.workload, steps=4))
    result = bench.run_one("available_kv", "adaptive", setup).result
    assert result.finished_rollouts == result.rollouts
    starts, spans = result.batch_starts_s, result.batch_makespans_s
    ends = [start + span for start, span in zip(starts, spans)]
    assert starts[:2] == (0.0, 0.0)  # two steps in flight from the start
    for s in range(2, 4):  # step s waits for steps 0..s-2, and starts as soon as they are done
        assert starts[s] == pytest.approx(max(ends[: s - 1]))
    assert result.makespan_s == pytest.approx(max(ends)) and result.makespan_s < sum(spans)


def test_the_bound_follows_the_step_ordering_rule() -> None:
    setup = bench.quick_setup(async_steps=2)
    batches = make_workload(setup.workload)
    cfg, n = setup.cluster.engine, setup.cluster.num_replicas
    work = [bench.work_bound(b, cfg, n) for b in batches]
    per_step = [max(w, max(bench.critical_path(p, cfg) for p in b)) for w, b in zip(work, batches)]
    sync = dataclasses.replace(setup.cluster, max_async_steps=1)
    assert bench.ideal_makespan(batches, sync) == pytest.approx(sum(per_step))
    # both steps may start at once: the longer of either step alone, or all the work together
    assert bench.ideal_makespan(batches, setup.cluster) == pytest.approx(max(*per_step, sum(work)))


def test_the_probe_runs_one_configuration_with_traces_and_refuses_a_bad_one() -> None:
    import subprocess

    probe = Path(__file__).resolve().parent.parent / "bench" / "routing_probe.py"
    args = [sys.executable, str(probe), "--seeds", "3", "--async-steps", "1", "--jobs", "1", "--trace"]
    done = subprocess.run(
        [*args, "available_kv:adaptive:move"], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    summary, *steps = done.stdout.strip().splitlines()
    assert summary.startswith("available_kv:adaptive:move") and "x bound" in summary
    assert [line.split(":")[0].strip() for line in steps] == [f"seed 3 K=1 step {s}" for s in range(3)]
    bad = subprocess.run([*args, "available_kv:fixed:oracle"], capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "the oracle order needs an adaptive cap" in bad.stderr
