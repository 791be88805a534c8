"""The engine benchmark's shared-host fit: vLLM's in-run figures become the simulated replica's curves."""

from __future__ import annotations

import pytest
from routing_lab.closed_loop import Point
from routing_lab.contention import fit, load_point
from routing_lab.engines import Counters, Load

from terminus_env.serving.sim.config import SimConfig, curve_at

STEPS = SimConfig(step_base_s=0.002, step_per_token_s=0.0, step_per_seq_s=0.001, step_per_context_token_s=0.0,
                  step_per_token_pair_s=0.0)


def point(limit: int, itl_s: float, client_s: float, inference_s: float, requests: int = 100) -> Point:
    # 1000 steps decoding 2 sequences each (so a token sees 3: 2 + 1 ms + 3 × 1 ms = 5 ms by the probes' model)
    counters = Counters(requests=requests, generation_tokens=2100, prompt_tokens=requests * 500,
                        prefix_hits=requests * 400, prefix_queries=requests * 500, queue_s=requests * 0.01,
                        queued=requests, e2e_s=requests * (inference_s + 0.02), inference_s=requests * inference_s,
                        steps=1000, step_tokens=2000, itl_s=2000 * itl_s, itl_count=2000)
    load = Load(samples=1, kv_usage=[0.1, 0.1], running=[1.0, 1.0], waiting=[0.0, 0.0], kv_spread=0.0)
    return Point(label=f"fixed {limit}", window_s=10.0, counters=counters, per_replica=(counters,), load=load,
                 in_flight=limit, limit_min=limit, limit_max=limit, rollouts_done=10, final_traces=(),
                 context_limited=0, load_average=2.0, wall_s=10.0, client_requests=requests,
                 client_s=requests * client_s)


def test_the_step_multiplier_is_vllm_s_inter_token_latency_over_the_probes_model_and_the_rest_is_outside() -> None:
    p = load_point(point(16, itl_s=0.010, client_s=0.5, inference_s=0.3), STEPS, replicas=2, http_overhead_s=0.01)
    assert p.model_step_s == pytest.approx(0.005)
    assert p.step_multiplier == pytest.approx(2.0)
    assert p.outside_s == pytest.approx(0.5 - 0.01 - 0.3 - 0.01)  # client - queue - inference - HTTP
    assert p.open_requests == pytest.approx(100 * 0.5 / 10 / 2)  # Little: latency × rate, per replica


def test_the_curves_rise_with_the_requests_open_and_scale_the_probes_to_the_run() -> None:
    points = [load_point(point(limit, itl, client, 0.2), STEPS, 2, 0.0)
              for limit, itl, client in ((64, 0.015, 2.0), (4, 0.004, 0.25), (16, 0.010, 0.6), (8, 0.003, 0.25))]
    config = fit(points, STEPS)
    xs = [x for x, _ in config.step_contention]
    assert xs == sorted(xs) and len(xs) == 3  # 4 and 8 opened as many requests: the later is dropped
    assert [round(m, 2) for _, m in config.step_contention] == [0.8, 2.0, 3.0]  # 4 ms against the model's 5: 0.8
    assert curve_at(config.frontend_s, 1000, 0.0) == pytest.approx(2.0 - 0.01 - 0.2)  # flat beyond the last point
    assert config.step_base_s == STEPS.step_base_s  # the probes' model is kept; the curves scale it


def test_a_window_without_engine_steps_is_a_clear_error() -> None:
    empty = point(4, 0.01, 0.5, 0.3)
    empty = Point(**{**empty.__dict__, "counters": Counters()})
    with pytest.raises(ValueError, match="lengthen it"):
        load_point(empty, STEPS, 2, 0.0)
