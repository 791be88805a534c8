"""How many rollouts to keep in flight: the seed's concurrency rule, in numbers.

``min(pipeline cap, KV pool / (trace length × KV bytes per token) × DP × headroom)``: admit only
what the engines can keep resident, so waiting queues and preemption do not eat the throughput.
Headroom applies to the KV side only: the pipeline cap is an exact bound, while the KV estimate
is an average that bursts and long outliers overrun.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from os import PathLike
from pathlib import Path
from typing import Any

from terminus_env.serving.metrics import EngineMetrics

_DTYPE_BYTES = {
    "float32": 4, "fp32": 4, "float": 4,
    "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2,
    "fp8": 1, "float8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "fp8_e4m3": 1, "fp8_e5m2": 1,
}  # fmt: skip


def pipeline_concurrency_cap(max_async_steps: int, batch_size: int, group_size: int) -> int:
    """Rollouts the training pipeline can have in flight at most: ``steps × prompts × group``."""
    for name, value in (("max_async_steps", max_async_steps), ("batch_size", batch_size), ("group_size", group_size)):
        _require_positive(name, value)
    return max_async_steps * batch_size * group_size


def kv_bytes_per_token(config: Mapping[str, Any] | str | PathLike[str], dtype_bytes: int | None = None) -> int:
    """KV-cache bytes one token costs across the whole model, from a Hugging Face ``config.json``.

    ``config`` is the parsed dict, a path to ``config.json``, or a model folder holding one.
    Standard attention stores K and V per KV head: ``2 × layers × kv_heads × head_dim × bytes``
    (tensor parallelism splits the heads across ranks but not the replica's total). MLA models
    (DeepSeek) store one compressed latent plus the rope key: ``(kv_lora_rank + qk_rope_head_dim)
    × layers × bytes``. ``dtype_bytes`` overrides the config's dtype, e.g. 1 for an fp8 KV cache.
    """
    cfg = _text_config(_load_config(config))
    if dtype_bytes is None:
        dtype_bytes = _dtype_bytes(cfg)
    _require_positive("dtype_bytes", dtype_bytes)
    layers = _config_int(cfg, "num_hidden_layers")
    if cfg.get("kv_lora_rank"):
        return (_config_int(cfg, "kv_lora_rank") + _config_int(cfg, "qk_rope_head_dim")) * layers * dtype_bytes
    heads = _config_int(cfg, "num_attention_heads")
    kv_heads = _config_int(cfg, "num_key_value_heads") if cfg.get("num_key_value_heads") else heads
    if cfg.get("head_dim"):
        head_dim = _config_int(cfg, "head_dim")
    else:
        hidden = _config_int(cfg, "hidden_size")
        if hidden % heads:
            raise ValueError(
                f"config: hidden_size {hidden} is not a multiple of num_attention_heads {heads}; "
                "add an explicit head_dim"
            )
        head_dim = hidden // heads
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def requests_per_rank(usable_kv_pool_bytes: float, avg_trace_tokens: float, kv_bytes_per_token: float) -> float:
    """``x``: whole traces one replica's KV pool holds at once (a float; round where you use it)."""
    _require_positive("usable_kv_pool_bytes", usable_kv_pool_bytes)
    _require_positive("avg_trace_tokens", avg_trace_tokens)
    _require_positive("kv_bytes_per_token", kv_bytes_per_token)
    return usable_kv_pool_bytes / (avg_trace_tokens * kv_bytes_per_token)


def max_rollout_concurrency(pipeline_cap: int, per_rank: float, dp: int, headroom: float = 0.9) -> int:
    """``min(pipeline_cap, floor(per_rank × dp × headroom))``.

    Raises ValueError when not even one trace fits after headroom: a cap of zero would stall
    every rollout, so the answer is a bigger KV pool or shorter traces, not a smaller cap.
    """
    _require_positive("pipeline_cap", pipeline_cap)
    _require_positive("per_rank", per_rank)
    _require_positive("dp", dp)
    if not 0 < headroom <= 1:
        raise ValueError(f"headroom must be in (0, 1], got {headroom}")
    kv_cap = math.floor(per_rank * dp * headroom + 1e-9)
    if kv_cap < 1:
        raise ValueError(
            f"per_rank={per_rank:.3g} × dp={dp} × headroom={headroom} leaves room for no whole trace: "
            "give each replica more KV memory (tensor parallelism, gpu_memory_utilization) or cap trace length"
        )
    return min(pipeline_cap, kv_cap)


def requests_per_replica_from_metrics(metrics: EngineMetrics, avg_trace_tokens: float) -> float:
    """``x`` measured on a live replica: its KV pool in tokens (``num_gpu_blocks × block_size``)."""
    capacity = metrics.kv_capacity_tokens
    if capacity is None:
        raise ValueError(
            f"engine {metrics.engine!r} does not report num_gpu_blocks/block_size "
            "(vllm:cache_config_info): is it a vLLM V1 server that finished profiling?"
        )
    _require_positive("avg_trace_tokens", avg_trace_tokens)
    return capacity / avg_trace_tokens


def max_rollout_concurrency_from_metrics(
    replicas: Mapping[str, EngineMetrics], pipeline_cap: int, avg_trace_tokens: float, headroom: float = 0.9
) -> int:
    """The rule over live replicas, which need not be equal: sum each one's ``x`` instead of ``x × DP``."""
    if not replicas:
        raise ValueError("replicas is empty: scrape at least one replica's /metrics")
    total = sum(requests_per_replica_from_metrics(m, avg_trace_tokens) for m in replicas.values())
    return max_rollout_concurrency(pipeline_cap, total, 1, headroom)


def _load_config(config: Mapping[str, Any] | str | PathLike[str]) -> Mapping[str, Any]:
    if isinstance(config, Mapping):
        return config
    path = Path(config)
    if path.is_dir():
        path = path / "config.json"
    try:
        loaded: Mapping[str, Any] = json.loads(path.read_text())
        return loaded
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"config: cannot read a Hugging Face config.json at {path}: {exc}") from exc


def _text_config(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    """Multimodal configs nest the language model's numbers under ``text_config``."""
    nested = cfg.get("text_config")
    if isinstance(nested, Mapping) and "num_hidden_layers" in nested:
        return {**{k: v for k, v in cfg.items() if k in ("torch_dtype", "dtype")}, **nested}
    return cfg


def _dtype_bytes(cfg: Mapping[str, Any]) -> int:
    raw = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    name = str(raw).removeprefix("torch.").lower()
    if name not in _DTYPE_BYTES:
        raise ValueError(f"config: unknown dtype {raw!r}; pass dtype_bytes explicitly")
    return _DTYPE_BYTES[name]


def _config_int(cfg: Mapping[str, Any], key: str) -> int:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"config: {key} must be a positive integer, got {value!r}")
    return value


def _require_positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
