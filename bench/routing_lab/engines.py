"""Real vLLM replicas on this machine's CPU for the engine benchmarks, and what their ``/metrics`` say during a run.

The model is :mod:`terminus_env.cli.tiny_model`'s random Qwen2 (float32, two layers, one KV head of 64: 1,024 KV bytes
per token; ``bench/engines.py quick`` cuts it to one layer, 512 bytes, which decodes half again as fast). It decodes
thousands of tokens a second on one core, so what limits a replica is its KV pool, which vLLM's block-count override
(``--num-gpu-blocks-override``) sets small enough that an agentic workload's working set exceeds it several times. Each
replica is started by ``terminus-env serve --device cpu`` (one core each, whole prefills, development endpoints for
``/reset_prefix_cache``) with vLLM's FLOP estimate on (``--enable-mfu-metrics``): vLLM 0.32 counts prompt tokens and
prefix-cache lookups only at a request's first admission, so the estimate, which prices every scheduled token, is its
only counter that sees the work a preempted request does again.

:class:`EngineShape` holds the settings a replica runs with, for vLLM and for the simulated replica that stands for it
(:meth:`EngineShape.sim_config`). Workloads are spoken in :func:`one_token_words`, so that a plan's token counts and
shared prefixes hold for the model's tokenizer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from terminus_env.serving.capacity import kv_bytes_per_token
from terminus_env.serving.serve_process import ServeProcess, free_ports
from terminus_env.serving.sim.engine import SimConfig

MODEL_NAME = "tiny"
MODEL_LAYERS = 2  # the tiny model's own
SIM_TIME_SCALE = 1.0  # the simulated replicas keep real time: under this machine's load a faster clock ran behind
START_TIMEOUT_S = 900.0
IDLE_TIMEOUT_S = 120.0
_OVERRIDE_LINE = re.compile(r"Overriding num_gpu_blocks=(\d+) with num_gpu_blocks_override=(\d+)")


@dataclass(frozen=True)
class EngineShape:
    """One replica's engine settings, the same for vLLM and for the simulated replica that stands for it."""

    replicas: int = 2
    num_blocks: int = 384  # per replica: vLLM's --num-gpu-blocks-override (one of them is vLLM's null block)
    block_size: int = 32  # vLLM's CPU attention takes multiples of 32 only
    max_model_len: int = 4096
    max_num_seqs: int = 128  # vLLM's default for a CPU API server
    max_num_batched_tokens: int = 4096  # whole prefills (chunked prefill is off on CPU replicas): >= max_model_len

    @property
    def usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def kv_tokens(self) -> int:
        """A replica's usable KV pool in tokens."""
        return self.usable_blocks * self.block_size

    def engine_args(self) -> list[str]:
        return ["--num-gpu-blocks-override", str(self.num_blocks), "--block-size", str(self.block_size),
                "--max-model-len", str(self.max_model_len), "--max-num-batched-tokens",
                str(self.max_num_batched_tokens), "--enforce-eager", "--dtype", "float32", "--served-model-name",
                MODEL_NAME, "--enable-mfu-metrics"]  # fmt: skip

    def sim_config(self, steps: SimConfig) -> SimConfig:
        """The simulated replica: this shape, whole prefills, and ``steps``' step-time model (a calibration's)."""
        return dataclasses.replace(steps, num_gpu_blocks=self.num_blocks, block_size=self.block_size,
                                   max_num_seqs=self.max_num_seqs, max_model_len=self.max_model_len,
                                   max_num_batched_tokens=self.max_num_batched_tokens, enable_chunked_prefill=False)


def make_model(directory: Path, layers: int = MODEL_LAYERS) -> Path:
    """The tiny model with ``layers`` layers, made once per folder (a few seconds)."""
    from terminus_env.cli.tiny_model import TinyModelConfig, save_tiny_model

    if not (directory / "config.json").exists():
        save_tiny_model(directory, config=TinyModelConfig(num_hidden_layers=layers))
    return directory


def one_token_words(model_dir: Path) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Words the model's tokenizer encodes as one token after a space, and those tokens' ids.

    The words are a workload's vocabulary on this model (a plan's token counts and shared prefixes hold); the ids,
    sent as vLLM's ``allowed_token_ids``, keep the random model to those words, so that its reply comes back in the
    next prompt as the very tokens it generated (a random token sequence re-tokenizes into other tokens, and a
    session's prefix cache would miss every reply, as no trained model's output does)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    candidates = sorted({t[1:] for t in tokenizer.get_vocab() if t.startswith("Ġ") and t[1:].isascii()
                         and t[1:].isalpha()})  # fmt: skip
    pairs = [(w, tokenizer.encode(" " + w, add_special_tokens=False)) for w in candidates]
    pairs = [(w, ids[0]) for w, ids in pairs if len(ids) == 1]
    if len(pairs) < 64:
        raise RuntimeError(f"{model_dir}'s tokenizer has {len(pairs)} one-token words; a workload needs 64 at least")
    return tuple(w for w, _ in pairs), tuple(i for _, i in pairs)


@dataclass(frozen=True)
class Fleet:
    """The run's vLLM replicas and what is known of them."""

    model_dir: Path
    shape: EngineShape
    urls: tuple[str, ...]
    words: tuple[str, ...]  # one_token_words
    word_ids: tuple[int, ...]
    blocks: int  # num_gpu_blocks as the engine reports it
    kv: KvCheck
    startup_s: float  # 0 for replicas the run found running

    @property
    def extra(self) -> dict:
        """Sent with every request: the random model kept to the workload's words."""
        return {"allowed_token_ids": list(self.word_ids)}


def start_fleet(work: Path, shape: EngineShape, layers: int = MODEL_LAYERS) -> tuple[ServeProcess, Fleet]:
    """The tiny model made under ``work``, its replicas started; stop the ``ServeProcess`` when done."""
    model_dir = make_model(work / f"model-{layers}-layers", layers)
    words, ids = one_token_words(model_dir)
    served = serve(model_dir, shape, work / "logs-vllm")
    try:
        url = served.urls[0]
        fleet = Fleet(model_dir, shape, tuple(served.urls), words, ids, int(cache_config(url)["num_gpu_blocks"]),
                      kv_check(model_dir, served.log_dir, url), served.startup_s)
    except BaseException:
        served.stop()
        raise
    return served, fleet


def attach_fleet(urls: Sequence[str], log_dir: Path, shape: EngineShape) -> Fleet:
    """Replicas already running, as :func:`serve` starts them (``log_dir`` their ``serve --log-dir``): checked against
    ``shape``, and left running. Their model is the folder they serve (``/v1/models``' root)."""
    card = httpx.get(f"{urls[0]}/v1/models", timeout=30).json()["data"][0]
    labels = cache_config(urls[0])
    found = {"replicas": len(urls), "num_blocks": int(labels["num_gpu_blocks"]),
             "block_size": int(labels["block_size"]), "max_model_len": int(card["max_model_len"])}  # fmt: skip
    wrong = {name: value for name, value in found.items() if value != getattr(shape, name)}
    if wrong:
        raise ValueError(f"replicas {list(urls)} are not in the benchmark's shape: {wrong}; start them with "
                         f"EngineShape.engine_args() and --max-num-seqs {shape.max_num_seqs}")  # fmt: skip
    if "vllm:estimated_flops_per_gpu_total" not in httpx.get(f"{urls[0]}/metrics", timeout=30).text:
        raise ValueError(f"{urls[0]} has no FLOP estimate: start it with --enable-mfu-metrics")
    model_dir = Path(card["root"])
    words, ids = one_token_words(model_dir)
    return Fleet(model_dir, shape, tuple(urls), words, ids, found["num_blocks"], kv_check(model_dir, log_dir, urls[0]),
                 0.0)  # fmt: skip


def serve(model_dir: Path, shape: EngineShape, log_dir: Path) -> ServeProcess:
    """``terminus-env serve --device cpu`` with ``shape``: one core per replica; returns once every one answers."""
    args = ["--model", str(model_dir), "--dp", str(shape.replicas), "--port", str(free_ports(shape.replicas)),
            "--host", "127.0.0.1", "--device", "cpu", "--weight-sync", "--max-num-seqs", str(shape.max_num_seqs),
            "--", *shape.engine_args()]  # fmt: skip
    env = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    return ServeProcess(args, log_dir, env, timeout_s=START_TIMEOUT_S).start()


@dataclass(frozen=True)
class KvCheck:
    """KV bytes per token from the model's config against what vLLM made of its KV memory."""

    config_bytes_per_token: int  # terminus_env.serving.capacity.kv_bytes_per_token(config.json)
    kv_memory_bytes: int  # the KV space vLLM was given (VLLM_CPU_KVCACHE_SPACE), as its cache_config_info says
    profiled_blocks: int  # the blocks vLLM cut that space into, before the override (its log)
    block_size: int

    @property
    def vllm_bytes_per_token(self) -> float:
        return self.kv_memory_bytes / (self.profiled_blocks * self.block_size)


def kv_check(model_dir: Path, log_dir: Path, url: str) -> KvCheck:
    """``log_dir``: the replicas' logs (``serve --log-dir``), where vLLM says how many blocks it cut its memory into."""
    log = (log_dir / "replica-0.log").read_text(errors="replace")
    match = _OVERRIDE_LINE.search(log)
    if match is None:
        raise RuntimeError(f"no 'Overriding num_gpu_blocks=' line in {log_dir / 'replica-0.log'}")
    labels = cache_config(url)
    return KvCheck(kv_bytes_per_token(model_dir), int(labels["kv_cache_memory_bytes"]), int(match.group(1)),
                   int(labels["block_size"]))


def cache_config(url: str) -> dict[str, str]:
    """The labels of a replica's ``vllm:cache_config_info``."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:cache_config_info":
                return dict(sample.labels)
    raise RuntimeError(f"{url}/metrics has no vllm:cache_config_info: is it a vLLM V1 server?")


# -- counters ------------------------------------------------------------------------------------------------------

_SERIES = {
    "vllm:num_preemptions_total": "preemptions",
    "vllm:e2e_request_latency_seconds_count": "requests",
    "vllm:generation_tokens_total": "generation_tokens",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:prefix_cache_queries_total": "prefix_queries",
    "vllm:prefix_cache_hits_total": "prefix_hits",
    "vllm:request_queue_time_seconds_sum": "queue_s",
    "vllm:request_queue_time_seconds_count": "queued",
    "vllm:estimated_flops_per_gpu_total": "flops",
    "vllm:e2e_request_latency_seconds_sum": "e2e_s",
    "vllm:request_inference_time_seconds_sum": "inference_s",
    "vllm:iteration_tokens_total_count": "steps",
    "vllm:iteration_tokens_total_sum": "step_tokens",
    "vllm:inter_token_latency_seconds_sum": "itl_s",
    "vllm:inter_token_latency_seconds_count": "itl_count",
}


@dataclass(frozen=True)
class Counters:
    """One replica's counters (all engines of its server summed); ``flops`` is 0 where the server has no estimate."""

    preemptions: float = 0.0
    requests: float = 0.0  # finished requests, every finish reason
    generation_tokens: float = 0.0
    prompt_tokens: float = 0.0
    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    queue_s: float = 0.0  # total seconds requests waited in the engine before their first step
    queued: float = 0.0
    flops: float = 0.0
    # vLLM's own timings (the simulated replica has e2e only): where a request's time goes under load
    e2e_s: float = 0.0  # total seconds from a request's arrival at the engine's frontend to its end
    inference_s: float = 0.0  # total seconds requests ran in the engine (prefill and decode)
    steps: float = 0.0  # engine steps
    step_tokens: float = 0.0  # tokens scheduled over those steps
    itl_s: float = 0.0  # total seconds between a request's consecutive output tokens
    itl_count: float = 0.0

    def minus(self, before: Counters) -> Counters:
        return Counters(**{f.name: getattr(self, f.name) - getattr(before, f.name) for f in dataclasses.fields(self)})

    def plus(self, other: Counters) -> Counters:
        return Counters(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self)})


def parse_counters(text: str) -> Counters:
    from prometheus_client.parser import text_string_to_metric_families

    seen: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = _SERIES.get(sample.name)
            if name is not None:
                seen[name] = seen.get(name, 0.0) + sample.value
    return Counters(**seen)


async def read_counters(urls: Sequence[str]) -> dict[str, Counters]:
    async with httpx.AsyncClient(timeout=30) as http:
        texts = await asyncio.gather(*(http.get(f"{url}/metrics") for url in urls))
    return {url: parse_counters(r.text) for url, r in zip(urls, texts)}


async def max_lag_s(urls: Sequence[str]) -> float:
    """The most any simulated engine's clock ran behind the wall clock (``terminus_sim:max_lag_seconds``); 0 for
    vLLM, which has no such series."""
    lags = [0.0]
    async with httpx.AsyncClient(timeout=30) as http:
        for response in await asyncio.gather(*(http.get(f"{url}/metrics") for url in urls)):
            lags += [float(line.rsplit(" ", 1)[1]) for line in response.text.splitlines()
                     if line.startswith("terminus_sim:max_lag_seconds{")]  # fmt: skip
    return max(lags)


def total(counters: dict[str, Counters]) -> Counters:
    out = Counters()
    for c in counters.values():
        out = out.plus(c)
    return out


# -- load across replicas ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Load:
    """What the replicas held, sampled while a run went on."""

    samples: int
    kv_usage: tuple[float, ...]  # per replica: mean of vLLM's kv_cache_usage_perc (KV pinned by live requests)
    running: tuple[float, ...]  # per replica: mean requests running
    waiting: tuple[float, ...]  # per replica: mean requests waiting in the engine
    kv_spread: float  # mean over samples where any replica was busy of (max - min) KV usage across replicas


class LoadSampler:
    """``with LoadSampler(urls) as s: ...; s.load()``: samples every replica's gauges in a thread of its own, so it runs
    beside any event loop (``routing_http.run_row`` runs its own). A run shorter than one interval is sampled once as
    it ends."""

    def __init__(self, urls: Sequence[str], interval_s: float = 0.5) -> None:
        self.urls = list(urls)
        self.interval_s = interval_s
        self._rows: list[list[tuple[float, float, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load-sampler", daemon=True)

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        if not self._rows:
            with httpx.Client(timeout=10) as http:
                self._sample(http)

    def _run(self) -> None:
        with httpx.Client(timeout=10) as http:
            while not self._stop.wait(self.interval_s):
                self._sample(http)

    def _sample(self, http: httpx.Client) -> None:
        from terminus_env.serving.metrics import combine, parse_metrics

        row = []
        try:
            for url in self.urls:
                m = combine(parse_metrics(http.get(f"{url}/metrics").text).values())
                row.append((m.kv_cache_usage, m.num_requests_running, m.num_requests_waiting))
        except (httpx.HTTPError, ValueError):
            return  # a missed sample; the run goes on
        self._rows.append(row)

    def load(self) -> Load:
        rows = self._rows
        if not rows:
            n = len(self.urls)
            return Load(0, (0.0,) * n, (0.0,) * n, (0.0,) * n, 0.0)
        per = list(zip(*rows))  # per replica: its samples
        busy = [row for row in rows if any(r[1] + r[2] > 0 for r in row)]
        spread = statistics.fmean(max(r[0] for r in row) - min(r[0] for r in row) for row in busy) if busy else 0.0
        return Load(len(rows), tuple(statistics.fmean(s[0] for s in samples) for samples in per),
                    tuple(statistics.fmean(s[1] for s in samples) for samples in per),
                    tuple(statistics.fmean(s[2] for s in samples) for samples in per), spread)


async def settle(urls: Sequence[str], reset: bool = True) -> None:
    """Wait until no replica runs or queues a request (aborted ones included), then empty their prefix caches."""
    from terminus_env.serving.metrics import combine, parse_metrics

    deadline = time.monotonic() + IDLE_TIMEOUT_S
    async with httpx.AsyncClient(timeout=30) as http:
        while True:
            texts = await asyncio.gather(*(http.get(f"{url}/metrics") for url in urls))
            metrics = [combine(parse_metrics(r.text).values()) for r in texts]
            if all(m.num_requests_running == 0 and m.num_requests_waiting == 0 for m in metrics):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"replicas {list(urls)} still busy {IDLE_TIMEOUT_S:.0f}s after the run ended")
            await asyncio.sleep(0.2)
        if reset:
            for url in urls:
                response = await http.post(f"{url}/reset_prefix_cache")
                if response.status_code != 200:
                    raise RuntimeError(f"{url}/reset_prefix_cache answered HTTP {response.status_code}: start the "
                                       "replicas with their development endpoints (serve --weight-sync)")
