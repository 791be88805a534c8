"""What the serving layer knows about one vLLM engine's load, read from its Prometheus ``/metrics``.

The dataclass is the contract between the replica client (which scrapes), the simulator (which
exposes the same numbers) and the router / admission controller (which read them).
"""

from __future__ import annotations

from dataclasses import dataclass


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
