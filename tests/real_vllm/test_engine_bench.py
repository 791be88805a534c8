"""``bench/engines.py quick`` on real vLLM replicas: the knee's sweep and the placement table come out whole, from
counters the engines and the simulator standing for them really kept. The quick mode does a fixed amount of work (its
points count finished rollouts), so it asserts what holds whatever the machine's speed and load (every row present,
the counters read and consistent), never a timing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from routing_lab import placement  # noqa: E402  (the benchmark's own modules live in bench/)

TIMEOUT_S = 1200  # only to stop a hang: the quick run takes a few minutes on the shared 2-core machine


@pytest.mark.timeout(TIMEOUT_S + 120)
def test_the_quick_engine_benchmark_fills_every_row_from_the_engines_counters(fleet, tmp_path: Path) -> None:
    """On the session's replicas, which run in the benchmark's engine shape (the benchmark checks it)."""
    out, figure = tmp_path / "engines.json", tmp_path / "knee.png"
    replicas = [arg for url in fleet.urls for arg in ("--replica-url", url)]
    run = subprocess.run([sys.executable, str(BENCH / "engines.py"), "quick", "--json", str(out), "--figure",
                          str(figure), "--logs", str(tmp_path / "work"), *replicas, "--replica-logs",
                          str(fleet.log_dir)], capture_output=True, text=True, timeout=TIMEOUT_S)  # fmt: skip
    print(run.stdout[-6000:])
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "bench/engines.py quick: " in run.stdout  # its own wall time, in the log
    data = json.loads(out.read_text())

    # The formula's KV bytes per token (the model's config) is what vLLM made of its KV memory.
    kv = data["kv_check"]
    assert kv["config_bytes_per_token"] == kv["vllm_bytes_per_token"] == 512  # the tests' one-layer model

    knee = data["knee"]["workloads"]["steady"]
    cap = knee["formula"]["cap"]
    assert 1 <= cap < knee["formula"]["knee"]  # x × DP × 0.9, floored
    for side in ("engine", "sim"):
        points = {p["label"]: p for p in knee[side]}
        assert set(points) == {"fixed 4", "fixed 16", "fixed 64", f"formula {cap}", "adaptive"}, side
        for p in points.values():
            c = p["counters"]
            assert c["generation_tokens"] > 0 and c["requests"] > 0 and c["queued"] > 0, (side, p["label"])
            assert 0 <= c["prefix_hits"] <= c["prefix_queries"], (side, p["label"])
            assert (c["flops"] > 0) == (side == "engine"), (side, p["label"])  # vLLM's FLOP estimate is on
            assert p["in_flight"] > 0 and p["load"]["samples"] > 0, (side, p["label"])
        # Reuse is counted, but not at every point: a window whose new admissions all came while 64 sessions thrashed
        # the small cache (each one a re-admission after a preemption, which vLLM leaves out of the prefix counters)
        # can count no query at all.
        hits = sum(p["counters"]["prefix_hits"] for p in points.values())
        assert 0 < hits < sum(p["counters"]["prefix_queries"] for p in points.values()), side
        assert points["fixed 64"]["in_flight"] > points["fixed 16"]["in_flight"] > points["fixed 4"]["in_flight"]
    assert isinstance(knee["engine_knee"], int) and isinstance(knee["sim_knee"], int)
    for p in knee["engine"]:  # vLLM's own step figures, which the simulator's shared-host curves come from
        c = p["counters"]
        # (No bound of itl_count by generation_tokens: over a window of a few seconds vLLM counted more intervals than
        # tokens once, at load 40-60.)
        assert c["steps"] > 0 and c["itl_count"] > 0 and c["itl_s"] > 0, p["label"]
        assert 0 < c["inference_s"] < c["e2e_s"] and p["client_requests"] > 0 and p["client_s"] > 0, p["label"]
    shared = data["calibration"]["contention"]
    assert [p["limit"] for p in shared] == [4, 16, 64]
    assert all(p["itl_s"] > 0 and p["model_step_s"] > 0 and p["outside_s"] >= 0 for p in shared)
    config = data["calibration"]["config"]
    assert 1 <= len(config["step_contention"]) == len(config["frontend_s"]) <= 3
    assert all(multiplier > 0 for _, multiplier in config["step_contention"])
    assert figure.stat().st_size > 10_000

    runs = data["placement"]["runs"]
    expected = {(row.label, row.cap) for row in placement.ROWS}
    for side in ("vLLM", "sim"):
        mine = [r for r in runs if r["side"] == side]
        assert {(r["label"], r["cap"]) for r in mine} == expected, side
        for r in mine:
            # The replicas counted what the client saw: every row ran the whole workload, nothing was lost or replayed.
            assert r["counters"]["generation_tokens"] == r["output_tokens"] > 0, (side, r["label"], r["cap"])
            assert r["requests"] == mine[0]["requests"] and r["output_tokens"] == mine[0]["output_tokens"]
            assert r["makespan_s"] > 0 and len(r["per_replica"]) == 2 and r["load"]["samples"] > 0
    assert "ours vs vllm-router sticky_least_loaded fixed" in run.stdout
