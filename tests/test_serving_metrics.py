"""parse_metrics on a real vLLM capture, a data-parallel server and an old release's names."""

from __future__ import annotations

from pathlib import Path

import pytest

from terminus_env.serving.metrics import MetricsParseError, combine, parse_metrics

CAPTURE = Path(__file__).parent / "data" / "vllm-metrics-0.29-t4.txt"


def test_real_capture():
    engines = parse_metrics(CAPTURE.read_text())
    assert list(engines) == ["0"]
    m = engines["0"]
    assert (m.num_requests_running, m.num_requests_waiting, m.kv_cache_usage) == (0, 0, 0)
    # The *_created companions hold ~1.79e9 timestamps; the _total samples hold the counts.
    assert m.num_preemptions_total == 0
    assert (m.prefix_cache_queries_total, m.prefix_cache_hits_total) == (530, 432)
    assert (m.prompt_tokens_total, m.generation_tokens_total) == (530, 584)
    assert (m.block_size, m.num_gpu_blocks) == (16, 20184)
    assert m.kv_capacity_tokens == 322944


MULTI = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 5.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
vllm:num_requests_waiting{engine="1",model_name="m"} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="m"} 0.0
vllm:num_preemptions_created{engine="0",model_name="m"} 1.7e9
vllm:num_preemptions_total{engine="1",model_name="m"} 7.0
vllm:num_preemptions_created{engine="1",model_name="m"} 1.7e9
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1.0
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="3000"} 1.0
"""


def test_one_entry_per_engine_and_combined():
    engines = parse_metrics(MULTI)
    assert sorted(engines) == ["0", "1"]
    assert engines["1"].num_requests_running == 5 and engines["1"].num_preemptions_total == 7
    assert engines["0"].num_gpu_blocks == 1000
    both = combine(engines.values())
    assert (both.num_requests_running, both.num_requests_waiting, both.num_preemptions_total) == (8, 2, 7)
    assert both.kv_cache_usage == pytest.approx((0.25 * 1000 + 0.75 * 3000) / 4000)
    assert both.kv_capacity_tokens == 4000 * 16


OLD = """\
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.5
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 4.0
# TYPE vllm:gpu_prefix_cache_queries counter
vllm:gpu_prefix_cache_queries_total{model_name="m"} 100.0
vllm:gpu_prefix_cache_queries_created{model_name="m"} 1.7e9
# TYPE vllm:gpu_prefix_cache_hits counter
vllm:gpu_prefix_cache_hits_total{model_name="m"} 40.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="32",num_gpu_blocks="None"} 1.0
"""


def test_old_names_and_missing_engine_label():
    m = parse_metrics(OLD)["0"]
    assert m.kv_cache_usage == 0.5 and m.num_requests_running == 4
    assert (m.prefix_cache_queries_total, m.prefix_cache_hits_total) == (100, 40)
    assert m.block_size == 32 and m.num_gpu_blocks is None and m.kv_capacity_tokens is None


def test_current_name_wins_over_deprecated_one():
    text = OLD + '# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name="m"} 0.125\n'
    assert parse_metrics(text)["0"].kv_cache_usage == 0.125


@pytest.mark.parametrize("text", ["", "process_cpu_seconds_total 3.0\n", "{{{ not prometheus"])
def test_not_vllm_metrics_is_a_clear_error(text):
    with pytest.raises(MetricsParseError):
        parse_metrics(text)
