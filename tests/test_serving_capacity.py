"""The concurrency rule and KV arithmetic against the reference's worked numbers."""

from __future__ import annotations

import json

import pytest

from terminus_env.serving.capacity import (
    kv_bytes_per_token,
    max_rollout_concurrency,
    max_rollout_concurrency_from_metrics,
    pipeline_concurrency_cap,
    requests_per_rank,
    requests_per_replica_from_metrics,
)
from terminus_env.serving.metrics import EngineMetrics

KIB = 1024

# The fields that matter, from each model's public config.json.
QWEN25_7B = {
    "hidden_size": 3584,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "num_hidden_layers": 28,
    "torch_dtype": "bfloat16",
}
LLAMA31_8B = {
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "torch_dtype": "bfloat16",
}
# hidden/heads would give 80; Qwen3 states head_dim 128 explicitly.
QWEN3_32B = {
    "hidden_size": 5120,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "num_hidden_layers": 64,
    "torch_dtype": "bfloat16",
}
DEEPSEEK_V3 = {
    "hidden_size": 7168,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "num_hidden_layers": 61,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "torch_dtype": "bfloat16",
}


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (QWEN25_7B, 56 * KIB),
        (LLAMA31_8B, 128 * KIB),
        (QWEN3_32B, 256 * KIB),
        (DEEPSEEK_V3, (512 + 64) * 61 * 2),
    ],
)
def test_kv_bytes_per_token_matches_worked_numbers(config, expected):
    assert kv_bytes_per_token(config) == expected


def test_kv_bytes_dtype_from_config_and_override():
    assert kv_bytes_per_token({**LLAMA31_8B, "torch_dtype": "float32"}) == 256 * KIB
    assert kv_bytes_per_token({**LLAMA31_8B, "torch_dtype": None, "dtype": "float16"}) == 128 * KIB
    assert kv_bytes_per_token(LLAMA31_8B, dtype_bytes=1) == 64 * KIB  # fp8 KV cache


def test_kv_bytes_without_gqa_uses_attention_heads():
    mha = {k: v for k, v in LLAMA31_8B.items() if k != "num_key_value_heads"}
    assert kv_bytes_per_token(mha) == 4 * 128 * KIB


def test_kv_bytes_reads_nested_text_config_and_files(tmp_path):
    multimodal = {
        "model_type": "vlm",
        "torch_dtype": "bfloat16",
        "vision_config": {"hidden_size": 1},
        "text_config": {k: v for k, v in QWEN25_7B.items() if k != "torch_dtype"},
    }
    assert kv_bytes_per_token(multimodal) == 56 * KIB
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_32B))
    assert kv_bytes_per_token(tmp_path) == 256 * KIB
    assert kv_bytes_per_token(str(tmp_path / "config.json")) == 256 * KIB


@pytest.mark.parametrize(
    ("config", "word"),
    [
        ({**LLAMA31_8B, "num_hidden_layers": 0}, "num_hidden_layers"),
        ({**LLAMA31_8B, "torch_dtype": "int3"}, "dtype"),
        ({**LLAMA31_8B, "hidden_size": 4095}, "head_dim"),
    ],
)
def test_kv_bytes_bad_config_is_a_clear_error(config, word):
    with pytest.raises(ValueError, match=word):
        kv_bytes_per_token(config)


def test_kv_bytes_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        kv_bytes_per_token(tmp_path)


def test_the_rule_end_to_end():
    cap = pipeline_concurrency_cap(max_async_steps=2, batch_size=32, group_size=8)
    assert cap == 512
    # 40 GiB of KV for Llama-3.1-8B, traces of 20k tokens: 16.384 traces per rank.
    x = requests_per_rank(40 * 1024**3, 20_000, kv_bytes_per_token(LLAMA31_8B))
    assert x == pytest.approx(16.384)
    assert max_rollout_concurrency(cap, x, dp=8) == 117  # floor(16.384 × 8 × 0.9)
    assert max_rollout_concurrency(cap, x, dp=8, headroom=1.0) == 131
    assert max_rollout_concurrency(100, x, dp=8) == 100  # the pipeline binds


def test_no_whole_trace_fits_is_an_error_not_a_zero_cap():
    with pytest.raises(ValueError, match="no whole trace"):
        max_rollout_concurrency(64, 1.05, dp=1)


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: pipeline_concurrency_cap(0, 32, 8), "max_async_steps"),
        (lambda: pipeline_concurrency_cap(2, -1, 8), "batch_size"),
        (lambda: requests_per_rank(1e9, 0, 1024), "avg_trace_tokens"),
        (lambda: requests_per_rank(-1, 10, 1024), "usable_kv_pool_bytes"),
        (lambda: max_rollout_concurrency(10, 2.0, dp=0), "dp"),
        (lambda: max_rollout_concurrency(10, 2.0, dp=1, headroom=1.5), "headroom"),
        (lambda: kv_bytes_per_token(LLAMA31_8B, dtype_bytes=0), "dtype_bytes"),
    ],
)
def test_bad_numbers_name_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def _engine(blocks, block_size=16):
    return EngineMetrics("0", 0, 0, 0.0, 0, 0, 0, 0, 0, blocks, block_size)


def test_from_live_replicas():
    # The capture's T4: 20184 blocks × 16 = 322944 tokens.
    assert requests_per_replica_from_metrics(_engine(20184), 10_000) == pytest.approx(32.2944)
    replicas = {"a": _engine(20184), "b": _engine(10092)}
    assert max_rollout_concurrency_from_metrics(replicas, 1000, 10_000) == 43  # floor(48.44 × 0.9)
    with pytest.raises(ValueError, match="cache_config_info"):
        requests_per_replica_from_metrics(_engine(None), 10_000)
