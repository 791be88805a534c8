"""The simulated engines' numbers as vLLM's Prometheus ``/metrics``: same names, labels and types.

Gauges and counters are read from each :class:`SimReplica` at scrape time (counters keep their
``_total``/``_created`` pair); latency histograms are observed as requests finish, in the
simulation's seconds. ``vllm:cache_config_info`` carries ``engine`` but not ``model_name``, as in
vLLM, with its values as strings. One series is the simulator's own: ``terminus_sim:max_lag_seconds``,
how far each engine's clock has run behind the wall clock, so a benchmark can tell whether the CPU
kept up.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from terminus_env.serving.sim.engine import SimFinished, SimReplica

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
_REQUEST_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
_LABELS = ["model_name", "engine"]
_GAUGES = (
    ("vllm:num_requests_running", "Number of requests in model execution batches.", "num_requests_running"),
    ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", "num_requests_waiting"),
    ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", "kv_cache_usage"),
)
_COUNTERS = (
    ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", "num_preemptions_total"),
    ("vllm:prompt_tokens", "Number of prefill tokens processed.", "prompt_tokens_total"),
    ("vllm:generation_tokens", "Number of generation tokens processed.", "generation_tokens_total"),
    (
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        "prefix_cache_queries_total",
    ),
    ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", "prefix_cache_hits_total"),
)


# vLLM 0.32's labels of vllm:cache_config_info, in its order, and the values a single-engine GPU server shows.
_CACHE_CONFIG_LABELS = (
    "_block_size_resolved", "block_size", "cache_dtype", "cache_hit_alignment_tokens", "effective_attention_block_size",
    "enable_mamba_shared_prefix_checkpoint", "enable_prefix_caching", "engine", "gpu_memory_utilization",
    "hash_block_size", "is_attention_free", "kv_cache_dtype_skip_layers", "kv_cache_layout", "kv_cache_max_concurrency",
    "kv_cache_memory_bytes", "kv_cache_size_tokens", "kv_offloading_backend", "kv_offloading_size",
    "kv_sharing_fast_prefill", "mamba_block_size", "mamba_cache_dtype", "mamba_cache_mode", "mamba_page_size_padded",
    "mamba_ssm_cache_dtype", "num_cpu_blocks", "num_gpu_blocks", "num_gpu_blocks_override",
    "prefix_cache_retention_interval", "prefix_caching_hash_algo", "prefix_match_unit", "replayssm_buffer_len",
    "skip_page_size_padded", "sliding_window", "swa_bounded_replay", "use_kda_recoverssm", "use_replayssm",
    "user_specified_block_size",
)  # fmt: skip
_CACHE_CONFIG_DEFAULTS = {
    "_block_size_resolved": "True", "cache_dtype": "auto", "enable_mamba_shared_prefix_checkpoint": "False",
    "gpu_memory_utilization": "0.92", "is_attention_free": "False", "kv_cache_dtype_skip_layers": "[]",
    "kv_offloading_backend": "native", "kv_sharing_fast_prefill": "False", "mamba_cache_dtype": "auto",
    "mamba_cache_mode": "none", "mamba_ssm_cache_dtype": "auto", "prefix_cache_retention_interval": "0",
    "prefix_caching_hash_algo": "sha256", "replayssm_buffer_len": "16", "swa_bounded_replay": "True",
    "use_kda_recoverssm": "False", "use_replayssm": "False", "user_specified_block_size": "False",
}  # fmt: skip


def _cache_config(replica: SimReplica) -> dict[str, str]:
    """One engine's cache-config labels: what the simulator models, vLLM's defaults for the rest ("None" unset)."""
    cfg = replica.config
    tokens = cfg.num_gpu_blocks * cfg.block_size
    modelled = {
        "block_size": str(cfg.block_size),
        "effective_attention_block_size": str(cfg.block_size),
        "enable_prefix_caching": str(cfg.enable_prefix_caching),
        "engine": replica.engine,
        "num_gpu_blocks": str(cfg.num_gpu_blocks),
        "kv_cache_size_tokens": str(tokens),
        "kv_cache_max_concurrency": str(round(tokens / cfg.max_model_len, 2)),
    }
    return {label: modelled.get(label, _CACHE_CONFIG_DEFAULTS.get(label, "None")) for label in _CACHE_CONFIG_LABELS}


class _EngineCollector(Collector):
    def __init__(
        self, model: str, replicas: Sequence[SimReplica], created: float, lags: Callable[[], Mapping[str, float]]
    ) -> None:
        self._model = model
        self._replicas = replicas
        self._created = created
        self._lags = lags

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        snapshots = [replica.metrics() for replica in self._replicas]
        for name, doc, field in _GAUGES:
            family = GaugeMetricFamily(name, doc, labels=_LABELS)
            for m in snapshots:
                family.add_metric([self._model, m.engine], getattr(m, field))
            yield family
        for name, doc, field in _COUNTERS:
            counter = CounterMetricFamily(name, doc, labels=_LABELS)
            for m in snapshots:
                counter.add_metric([self._model, m.engine], getattr(m, field), created=self._created)
            yield counter
        info = GaugeMetricFamily(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", labels=list(_CACHE_CONFIG_LABELS)
        )
        for replica in self._replicas:
            info.add_metric([_cache_config(replica)[label] for label in _CACHE_CONFIG_LABELS], 1.0)
        yield info
        lag = GaugeMetricFamily(
            "terminus_sim:max_lag_seconds", "Simulator only: the most the engine's clock ran behind the wall clock.",
            labels=_LABELS,
        )
        for engine, seconds in self._lags().items():
            lag.add_metric([self._model, engine], seconds)
        yield lag


class Exposition:
    """One server's ``/metrics``: a private registry, so several servers can live in one process."""

    def __init__(
        self, model: str, replicas: Sequence[SimReplica], lags: Callable[[], Mapping[str, float]] = dict
    ) -> None:
        self._model = model
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_EngineCollector(model, replicas, time.time(), lags))
        self._ttft = self._histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", _TTFT_BUCKETS
        )
        self._e2e = self._histogram(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", _REQUEST_BUCKETS
        )
        self._queue = self._histogram(
            "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", _REQUEST_BUCKETS
        )

    def _histogram(self, name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
        return Histogram(name, doc, labelnames=_LABELS, buckets=buckets, registry=self.registry)

    def observe(self, engine: str, done: SimFinished) -> None:
        labels = (self._model, engine)
        self._ttft.labels(*labels).observe(done.ttft_s)
        self._e2e.labels(*labels).observe(done.e2e_s)
        self._queue.labels(*labels).observe(done.queued_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)
