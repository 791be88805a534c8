"""What the serving layer knows about one vLLM engine's load, read from its Prometheus ``/metrics``.

The dataclass is the contract between the replica client (which scrapes), the simulator (which
exposes the same numbers) and the router / admission controller (which read them).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from terminus_env.errors import TerminusError


@dataclass(frozen=True)
class EngineMetrics:
    """One scrape of one engine (one ``engine`` label of one server).

    ``kv_cache_usage`` is vLLM's ``kv_cache_usage_perc``: ``1 - free / (num_gpu_blocks - 1)``, where
    *free* already includes cached blocks no live request holds. It measures KV pinned by live
    requests, not how warm the prefix cache is.
    """

    engine: str
    num_requests_running: float
    num_requests_waiting: float
    kv_cache_usage: float
    num_preemptions_total: float
    prompt_tokens_total: float
    generation_tokens_total: float
    prefix_cache_queries_total: float
    prefix_cache_hits_total: float
    num_gpu_blocks: int | None
    block_size: int | None

    @property
    def kv_capacity_tokens(self) -> int | None:
        """Usable KV pool in tokens (``num_gpu_blocks × block_size``), when the server says."""
        if self.num_gpu_blocks is None or self.block_size is None:
            return None
        return self.num_gpu_blocks * self.block_size


# vLLM renamed some series; the first name in each tuple is the current one.
_GAUGES = {
    "num_requests_running": ("vllm:num_requests_running",),
    "num_requests_waiting": ("vllm:num_requests_waiting",),
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
}
# Counters are read from their ``_total`` sample: the ``_created`` companion is a Unix timestamp.
_COUNTERS = {
    "num_preemptions_total": ("vllm:num_preemptions",),
    "prompt_tokens_total": ("vllm:prompt_tokens",),
    "generation_tokens_total": ("vllm:generation_tokens",),
    "prefix_cache_queries_total": ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
    "prefix_cache_hits_total": ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"),
}
_CACHE_CONFIG = "vllm:cache_config_info"


class MetricsParseError(TerminusError, ValueError):
    """The text is not Prometheus exposition, or holds no vLLM engine series."""


def parse_metrics(text: str) -> dict[str, EngineMetrics]:
    """Read one vLLM server's ``/metrics`` text into one :class:`EngineMetrics` per ``engine`` label.

    A data-parallel server reports every engine under the same endpoint, so the key is the
    ``engine`` label (``"0"`` when a very old release omits it). Series summed over other labels
    (``model_name``, LoRA names) are added up per engine.
    """
    values: dict[str, dict[tuple[str, int], float]] = {}
    cache: dict[str, dict[str, str]] = {}
    for name, labels, value in _samples(text):
        engine = labels.get("engine", "0")
        if name == _CACHE_CONFIG:
            cache[engine] = labels
            continue
        key = _FIELD_BY_SAMPLE.get(name)
        if key is not None:
            seen = values.setdefault(engine, {})
            seen[key] = seen.get(key, 0.0) + value
    if not values:
        raise MetricsParseError("no vllm:* engine series found: is this the /metrics of a vLLM server?")
    return {engine: _engine_metrics(engine, seen, cache.get(engine, {})) for engine, seen in values.items()}


def _samples(text: str):
    from prometheus_client.parser import text_string_to_metric_families

    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                yield sample.name, sample.labels, sample.value
    except ValueError as exc:
        raise MetricsParseError(f"not Prometheus exposition text: {exc}") from exc


def _sample_names() -> dict[str, tuple[str, int]]:
    """Map every accepted sample name to (dataclass field, rank): rank 0 is the current name."""
    names: dict[str, tuple[str, int]] = {}
    for field, aliases in _GAUGES.items():
        names.update({alias: (field, rank) for rank, alias in enumerate(aliases)})
    for field, aliases in _COUNTERS.items():
        names.update({f"{alias}_total": (field, rank) for rank, alias in enumerate(aliases)})
    return names


_FIELD_BY_SAMPLE = _sample_names()


def _engine_metrics(engine: str, seen: dict[tuple[str, int], float], cache: dict[str, str]) -> EngineMetrics:
    """Prefer the current name; a deprecated one counts only when the current one is absent."""

    def pick(field: str, aliases: tuple[str, ...]) -> float:
        return next((seen[(field, rank)] for rank in range(len(aliases)) if (field, rank) in seen), 0.0)

    read = {field: pick(field, aliases) for field, aliases in {**_GAUGES, **_COUNTERS}.items()}
    return EngineMetrics(
        engine=engine,
        num_gpu_blocks=_label_int(cache, "num_gpu_blocks"),
        block_size=_label_int(cache, "block_size"),
        **read,
    )


def _label_int(labels: dict[str, str], key: str) -> int | None:
    """Cache-config labels are strings, and ``"None"`` before the engine profiled its memory."""
    raw = labels.get(key)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def combine(engines: Iterable[EngineMetrics], engine: str = "all") -> EngineMetrics:
    """One server's engines seen as a single replica: counts add up, KV usage is block-weighted.

    The router and admission controller treat a server as one replica; when it runs several
    data-parallel engines behind one port, their sum is what that replica can hold.
    """
    engines = list(engines)
    if not engines:
        raise ValueError("engines is empty: combine needs at least one EngineMetrics")
    blocks = [m.num_gpu_blocks for m in engines]
    sizes = {m.block_size for m in engines}
    counted = [b for b in blocks if b is not None]
    known = len(counted) == len(blocks)
    if known and sum(counted) > 0:
        usage = sum(m.kv_cache_usage * b for m, b in zip(engines, counted)) / sum(counted)
    else:
        usage = sum(m.kv_cache_usage for m in engines) / len(engines)
    return EngineMetrics(
        engine=engine,
        num_requests_running=sum(m.num_requests_running for m in engines),
        num_requests_waiting=sum(m.num_requests_waiting for m in engines),
        kv_cache_usage=usage,
        num_preemptions_total=sum(m.num_preemptions_total for m in engines),
        prompt_tokens_total=sum(m.prompt_tokens_total for m in engines),
        generation_tokens_total=sum(m.generation_tokens_total for m in engines),
        prefix_cache_queries_total=sum(m.prefix_cache_queries_total for m in engines),
        prefix_cache_hits_total=sum(m.prefix_cache_hits_total for m in engines),
        num_gpu_blocks=sum(counted) if known else None,
        block_size=sizes.pop() if len(sizes) == 1 else None,
    )
