"""Fit the simulator's step-time model to a live vLLM server, and check it on a run that preempts.

Usage: .venv/bin/python bench/calibrate_sim.py --base-url URL [--base-url URL2 ...] [--model NAME]
       [--max-num-seqs 256] [--max-num-batched-tokens 8192] [--quick] [--clock client|engine] [--json FILE]

The simulator prices a step at ``base + per_token × scheduled tokens + per_seq × sequences + per_context ×
KV tokens read + per_pair × (token, earlier token) pairs`` (``SimConfig``). Three kinds of probe, over
the OpenAI chat API with ``ignore_eos`` so output lengths are exact, and fresh random prompts so no
prefix cache helps:

- prefill: one request of P prompt tokens and one output token; its latency is one prefill of P
  (``h + base + per_seq + (per_token + per_context) × P + per_pair × P(P+1)/2``, h the HTTP round trip);
- decode: B requests at once, each of P prompt tokens, run twice with N1 and N2 output tokens; the
  extra time per extra token is one decode step of B sequences at the mean context C
  (``base + (per_token + per_seq) × B + (per_context + per_pair) × B × C``);
- recompute: requests that overflow the KV pool so the engine preempts; the live makespan and
  preemption count are compared with the simulator's, with the fitted settings, on the same requests.

Least squares on the first two give the five coefficients (and h); the third says whether recompute
after preemption costs what the model says.

Each probe is timed twice: by the client's wall clock around its requests (``--clock client``, the default: what a
client sees, the HTTP round trip and a loaded host's delays included) and by the engine's own clock, vLLM's
``vllm:e2e_request_latency_seconds`` and ``vllm:time_to_first_token_seconds`` in ``/metrics`` (``--clock engine``:
from the request's arrival at the engine's frontend, so neither the HTTP nor the client's share of a busy host
counts; h is then about 0). By that clock a decode step is read from each request's time after its first token, so
where its prompt fell among the others' prefill chunks does not count either. A simulated replica reports its
virtual time there, which the host's load cannot move.

The KV pool comes from ``/metrics`` (``num_gpu_blocks × block_size``) and ``max_model_len`` from ``/v1/models``;
``max_num_seqs`` and ``max_num_batched_tokens`` are not published, so pass the values the server was started with.
The settings are printed as a ``SimConfig`` and as ``python -m terminus_env.serving.sim serve`` flags.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import enum
import json
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from terminus_env.serving.client import KEEPALIVE_EXPIRY_S, ReplicaClient
from terminus_env.serving.sim.engine import SimConfig, SimReplica, SimRequest

STEP_FIELDS = ("step_base_s", "step_per_token_s", "step_per_seq_s", "step_per_context_token_s",
               "step_per_token_pair_s")
_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Probes:
    """What to measure: prompt lengths for prefill; (batch, prompt) pairs and two output lengths for decode."""

    prefill_prompts: tuple[int, ...]
    decode_shapes: tuple[tuple[int, int], ...]
    decode_outputs: tuple[int, int]
    repeats: int
    overflow: float  # the recompute check asks for this many times the KV pool
    overflow_output: int  # output tokens of each of the recompute check's requests


FULL = Probes((128, 512, 1024, 2048, 3072, 4096, 6144, 8000), ((1, 256), (8, 256), (32, 256), (64, 256), (1, 4096),
              (8, 4096), (32, 2048)), (16, 144), 3, 1.6, 1024)
QUICK = Probes((128, 1024, 2048, 4096, 6000), ((1, 256), (16, 256), (48, 256), (1, 3000), (16, 2000)), (8, 72), 2, 1.5,
               256)


class Clock(str, enum.Enum):
    """What times a probe (see the module's docstring)."""

    CLIENT = "client"
    ENGINE = "engine"


@dataclass(frozen=True)
class Sample:
    kind: str  # "prefill" or "decode"
    batch: int
    prompt_tokens: int  # as the server counted them
    seconds: float  # prefill: the request's latency; decode: the time of one more output token (the client's clock)
    engine_seconds: float | None = None  # the same by the engine's clock; None where it was not read

    def time(self, clock: Clock) -> float:
        if clock is Clock.CLIENT:
            return self.seconds
        if self.engine_seconds is None:
            raise ValueError("a sample without the engine's time cannot be fitted by the engine's clock")
        return self.engine_seconds


@dataclass(frozen=True)
class Fit:
    config: SimConfig
    http_overhead_s: float
    residuals: tuple[float, ...]  # relative error of the model on each sample


_ENGINE_SERIES = {"vllm:e2e_request_latency_seconds_sum": "e2e_s", "vllm:time_to_first_token_seconds_sum": "ttft_s",
                  "vllm:e2e_request_latency_seconds_count": "finished"}


@dataclass(frozen=True)
class EngineTime:
    """Seconds by the engine's clock (vLLM's own histograms): from a request's arrival to its end, and to its first
    token; summed over ``finished`` requests, or a mean when ``finished`` is 1."""

    e2e_s: float
    ttft_s: float
    finished: float

    @property
    def decoding_s(self) -> float:
        """After the first token: the decode steps alone, without the wait for the prefill (which depends on where
        each prompt fell among the others' chunks)."""
        return self.e2e_s - self.ttft_s

    def minus(self, before: EngineTime) -> EngineTime:
        return EngineTime(self.e2e_s - before.e2e_s, self.ttft_s - before.ttft_s, self.finished - before.finished)

    def per_request(self) -> EngineTime:
        return EngineTime(self.e2e_s / self.finished, self.ttft_s / self.finished, 1.0)


class Server:
    """One live server: chat requests with exact output lengths, its KV pool and context limit."""

    def __init__(self, base_url: str, model: str | None, extra: dict | None = None) -> None:
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        where = urlsplit(self.base_url)
        if where.scheme != "http" or where.hostname is None:
            raise SystemExit(f"{base_url}: probes go over plain HTTP; give the server's http:// URL")
        self._host, self._port = where.hostname, where.port or 80
        self.http = httpx.AsyncClient(base_url=self.base_url, timeout=_TIMEOUT_S,
                                      limits=httpx.Limits(max_connections=None, keepalive_expiry=KEEPALIVE_EXPIRY_S))
        self.model = model
        self.extra = extra or {}  # more fields for every request's body, as the workload sends them
        self.chars_per_token = 4.0
        self._rng = random.Random(0)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def describe(self) -> tuple[str, int, int, int]:
        """The model name, max_model_len, num_gpu_blocks and block_size."""
        card = (await self.http.get("/v1/models")).json()["data"][0]
        async with ReplicaClient(self.base_url) as client:
            engines = await client.metrics()
        blocks = {m.num_gpu_blocks for m in engines.values()}
        sizes = {m.block_size for m in engines.values()}
        if None in blocks or None in sizes:
            raise SystemExit(f"{self.base_url}/metrics has no vllm:cache_config_info: is it a vLLM V1 server?")
        self.model = self.model or card["id"]
        return card["id"], int(card.get("max_model_len") or 0), min(blocks), min(sizes)  # type: ignore[type-var]

    async def preemptions(self) -> float:
        async with ReplicaClient(self.base_url) as client:
            return sum(m.num_preemptions_total for m in (await client.metrics()).values())

    async def engine_time(self) -> EngineTime:
        """The engine's clock so far, all engines together."""
        totals = dict.fromkeys(_ENGINE_SERIES.values(), 0.0)
        for family in text_string_to_metric_families((await self.http.get("/metrics")).text):
            for sample in family.samples:
                if sample.name in _ENGINE_SERIES:
                    totals[_ENGINE_SERIES[sample.name]] += sample.value
        return EngineTime(**totals)

    async def batch(self, texts: Sequence[str], output_tokens: int) -> tuple[list[tuple[int, int, float]], EngineTime]:
        """The requests at once, each as ``(prompt tokens, output tokens, seconds by the client's clock)``, and
        their means by the engine's clock.

        Each request has a connection of its own, opened first, and all are written in one go: on a busy host, a
        client that built and sent one request after another spread a batch of 48 over seconds, so its first
        requests ran in smaller batches than the probe asks for; written together, they reach the engine within
        a step."""
        before = await self.engine_time()
        bodies = [self._request(text, output_tokens) for text in texts]
        connections = await asyncio.gather(*(asyncio.open_connection(self._host, self._port) for _ in texts))
        sent = time.perf_counter()
        for (_, writer), body in zip(connections, bodies):
            writer.write(body)
        runs = await asyncio.gather(*(self._answer(reader, writer, sent) for reader, writer in connections))
        spent = (await self.engine_time()).minus(before)
        if spent.finished != len(texts):
            raise SystemExit(f"{self.base_url} finished {spent.finished:g} requests while probed with {len(texts)}: "
                             "another client is using it; probe a server of your own")
        return runs, spent.per_request()

    def _request(self, text: str, output_tokens: int) -> bytes:
        """One chat request on the wire, ``ignore_eos`` so that it makes exactly ``output_tokens``."""
        body = json.dumps({"model": self.model, "messages": [{"role": "user", "content": text}],
                           "max_tokens": output_tokens, "ignore_eos": True, "temperature": 0.0,
                           **self.extra}).encode()  # fmt: skip
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {self._host}:{self._port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n")
        return head.encode() + body

    async def _answer(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, sent: float
    ) -> tuple[int, int, float]:
        """(prompt tokens, output tokens, seconds since ``sent``) of the answer on a connection the server closes."""
        try:
            data = await asyncio.wait_for(reader.read(), _TIMEOUT_S)
        finally:
            writer.close()
        seconds = time.perf_counter() - sent
        head, _, body = data.partition(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0].split(b" ")[1:2]
        if status != [b"200"]:
            raise SystemExit(f"{self.base_url}: {head[:100]!r}: {body[:300]!r}")
        usage = json.loads(body)["usage"]
        return usage["prompt_tokens"], usage["completion_tokens"], seconds

    def prompt(self, tokens: int) -> str:
        """Fresh random words, about ``tokens`` long for this server's tokenizer (no prefix to reuse)."""
        words = int(tokens * self.chars_per_token / 8)  # seven characters and a space each
        return " ".join(f"q{self._rng.randrange(10**6):06d}" for _ in range(max(1, words)))

    async def learn_tokenizer(self) -> None:
        text = self.prompt(1000)
        [(prompt_tokens, _, _)], _ = await self.batch([text], 1)
        self.chars_per_token = len(text) / prompt_tokens


async def measure(server: Server, probes: Probes, like: SimConfig) -> list[Sample]:
    """Every probe ``probes.repeats`` times; each sample is the lower median of its repeats (a stall only
    ever adds time). Decode batches are cut to what ``max_num_seqs`` and 80% of the KV pool hold, so no
    probe is preempted."""
    await server.learn_tokenizer()
    longest = int(min(like.max_num_batched_tokens, like.max_model_len) * 0.9)  # one prefill chunk, room to spare
    pool = like.usable_blocks * like.block_size
    prefill: dict[int, list[Sample]] = {}
    decode: dict[tuple[int, int], list[Sample]] = {}
    n1, n2 = probes.decode_outputs
    shapes = list(dict.fromkeys(
        (max(1, min(batch, like.max_num_seqs, int(0.8 * pool / (p + n2 + 2 * like.block_size)))), p)
        for batch, p in probes.decode_shapes
    ))
    for _ in range(probes.repeats):
        for p in probes.prefill_prompts:
            [(prompt_tokens, _, seconds)], engine = await server.batch([server.prompt(min(p, longest))], 1)
            prefill.setdefault(p, []).append(Sample("prefill", 1, prompt_tokens, seconds, engine.e2e_s))
        for batch, p in shapes:
            times, engine_times, tokens = {}, {}, []
            for n in (n1, n2):
                runs, engine_times[n] = await server.batch([server.prompt(p) for _ in range(batch)], n)
                if any(out != n for _, out, _ in runs):
                    raise SystemExit(f"{server.base_url} ignored ignore_eos/max_tokens: asked {n} tokens")
                times[n] = statistics.fmean(seconds for _, _, seconds in runs)
                tokens += [prompt_tokens for prompt_tokens, _, _ in runs]
            step = (times[n2] - times[n1]) / (n2 - n1)
            engine_step = (engine_times[n2].decoding_s - engine_times[n1].decoding_s) / (n2 - n1)
            decode.setdefault((batch, p), []).append(
                Sample("decode", batch, round(statistics.fmean(tokens)), step, engine_step)
            )
    return [_median(group) for group in (*prefill.values(), *decode.values())]


def _median(group: Sequence[Sample]) -> Sample:
    """The lower median of the repeats, by each clock on its own."""
    ordered = sorted(group, key=lambda s: s.seconds)
    engine = sorted(s.engine_seconds for s in group if s.engine_seconds is not None)
    middle = ordered[(len(ordered) - 1) // 2]
    return dataclasses.replace(middle, engine_seconds=engine[(len(engine) - 1) // 2] if engine else None)


def fit(samples: Sequence[Sample], probes: Probes, like: SimConfig, clock: Clock = Clock.CLIENT) -> Fit:
    """Least squares: decode samples give base, per_token + per_seq and per_context + per_pair; prefill
    samples (one chunk each) give h + base + per_seq, per_token + per_context and per_pair; together,
    all five and h. The samples' times are read by ``clock``."""
    n1, n2 = probes.decode_outputs
    decode = [s for s in samples if s.kind == "decode"]
    prefill = [s for s in samples if s.kind == "prefill"]
    if len({s.batch for s in decode}) < 2 or len({s.prompt_tokens for s in prefill}) < 3:
        raise ValueError("need decode probes at two batch sizes at least and prefill probes at three lengths")
    # Decode: one step of B sequences, each reading its context; the context grows by one per step.
    context = [s.prompt_tokens + (n1 + n2) / 2 for s in decode]
    a = np.array([[1.0, s.batch, s.batch * c] for s, c in zip(decode, context)])
    (base, token_plus_seq, context_plus_pair), *_ = np.linalg.lstsq(a, np.array([s.time(clock) for s in decode]),
                                                                   rcond=None)
    # Prefill: one step (or chunks) of P tokens for one sequence.
    b = np.array([[1.0, s.prompt_tokens, s.prompt_tokens * (s.prompt_tokens + 1) / 2] for s in prefill])
    (intercept, token_plus_context, pair), *_ = np.linalg.lstsq(b, np.array([s.time(clock) for s in prefill]),
                                                                rcond=None)
    per_context = max(0.0, context_plus_pair - pair)
    per_token = max(0.0, token_plus_context - per_context)
    per_seq = max(0.0, token_plus_seq - per_token)
    overhead = intercept - base - per_seq
    config = dataclasses.replace(like, step_base_s=float(max(base, 1e-6)), step_per_token_s=float(per_token),
                                 step_per_seq_s=float(per_seq), step_per_context_token_s=float(per_context),
                                 step_per_token_pair_s=float(max(0.0, pair)))
    predicted = [_decode_step(config, s.batch, c) for s, c in zip(decode, context)]
    predicted += [overhead + _prefill_step(config, s.prompt_tokens) for s in prefill]
    observed = [s.time(clock) for s in decode] + [s.time(clock) for s in prefill]
    return Fit(config, float(overhead), tuple((p - o) / o for p, o in zip(predicted, observed)))


def _decode_step(cfg: SimConfig, batch: int, context: float) -> float:
    return (cfg.step_base_s + (cfg.step_per_token_s + cfg.step_per_seq_s) * batch
            + (cfg.step_per_context_token_s + cfg.step_per_token_pair_s) * batch * context)


def _prefill_step(cfg: SimConfig, prompt: int) -> float:
    return (cfg.step_base_s + cfg.step_per_seq_s + (cfg.step_per_token_s + cfg.step_per_context_token_s) * prompt
            + cfg.step_per_token_pair_s * prompt * (prompt + 1) / 2)


@dataclass(frozen=True)
class Recompute:
    requests: int
    prompt_tokens: int
    output_tokens: int
    live_s: float  # the makespan, by the client's clock
    live_preemptions: float
    sim_s: float
    sim_preemptions: int
    live_mean_e2e_s: float  # a request's mean latency by the engine's clock
    sim_mean_e2e_s: float


async def recompute_check(server: Server, config: SimConfig, overhead_s: float, probes: Probes) -> Recompute:
    """Requests that together need ``probes.overflow`` × the KV pool: the live run against the simulator's.
    Where ``max_num_seqs`` requests of ``max_model_len`` cannot fill the pool, nothing is preempted and the
    check only compares a full batch."""
    pool = config.usable_blocks * config.block_size
    count = config.max_num_seqs
    output = min(probes.overflow_output, config.max_model_len // 4)
    prompt = max(64, min(config.max_model_len - output - 64, int(pool * probes.overflow / count) - output))
    texts = [server.prompt(prompt) for _ in range(count)]
    before = await server.preemptions()
    runs, live = await server.batch(texts, output)
    makespan = max(seconds for _, _, seconds in runs)
    preempted = await server.preemptions() - before
    replica = SimReplica(config)
    for i, (prompt_tokens, _, _) in enumerate(runs):
        replica.submit(SimRequest(f"r{i}", tuple(range(i * 10**6, i * 10**6 + prompt_tokens)), output, output + 1))
    finished = []
    while replica.has_work():
        if replica.step() == 0.0:
            raise RuntimeError("the simulated replica cannot schedule the recompute check's requests")
        finished += replica.pop_finished()
    return Recompute(count, round(statistics.fmean(r[0] for r in runs)), output, makespan, preempted,
                     replica.now + overhead_s, replica.stats().preemptions, live.e2e_s,
                     statistics.fmean(done.e2e_s for done in finished))


def flags(config: SimConfig) -> str:
    return " ".join(f"--{name.replace('_', '-')} {getattr(config, name):.4g}" for name in STEP_FIELDS)


async def calibrate(base_urls: Sequence[str], model: str | None, max_num_seqs: int, max_num_batched_tokens: int,
                    probes: Probes, chunked_prefill: bool = True, extra: dict | None = None,
                    together: bool = False, clock: Clock = Clock.CLIENT) -> dict:
    """The fit and its check. ``extra`` goes into every request's body; ``together`` probes every server at once
    (replicas that share a machine's cores run slower together than alone, and a run has them all busy); ``clock``
    times the probes the fit reads."""
    servers = [Server(url, model, extra) for url in base_urls]
    try:
        name, max_len, blocks, block_size = await servers[0].describe()
        for other in servers[1:]:
            await other.describe()
        like = SimConfig(num_gpu_blocks=blocks, block_size=block_size, max_num_seqs=max_num_seqs,
                         max_model_len=max_len or SimConfig.max_model_len,
                         max_num_batched_tokens=max_num_batched_tokens, enable_chunked_prefill=chunked_prefill)
        if together:
            samples = [s for found in await asyncio.gather(*(measure(server, probes, like) for server in servers))
                       for s in found]  # fmt: skip
        else:
            samples = [s for server in servers for s in await measure(server, probes, like)]
        result = fit(samples, probes, like, clock)
        check = await recompute_check(servers[0], result.config, result.http_overhead_s, probes)
    finally:
        for server in servers:
            await server.aclose()
    return {"model": name, "config": result.config, "http_overhead_s": result.http_overhead_s,
            "residuals": result.residuals, "samples": samples, "recompute": check}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", action="append", required=True, help="a vLLM server (repeat for DP replicas)")
    parser.add_argument("--model", help="the served model name (default: the first of /v1/models)")
    parser.add_argument("--max-num-seqs", type=int, default=SimConfig.max_num_seqs, help="as the server was started")
    parser.add_argument("--max-num-batched-tokens", type=int, default=SimConfig.max_num_batched_tokens,
                        help="as the server was started")
    parser.add_argument("--no-chunked-prefill", action="store_true",
                        help="the server prefills whole (vLLM's CPU replicas: --no-enable-chunked-prefill)")
    parser.add_argument("--quick", action="store_true", help="fewer, smaller probes (about a minute)")
    parser.add_argument("--clock", choices=[c.value for c in Clock], default=Clock.CLIENT.value,
                        help="fit the client's times (HTTP and the host's load included) or the engine's own")
    parser.add_argument("--json", type=Path, help="also write the fit, the samples and the check here")
    args = parser.parse_args(argv)
    out = asyncio.run(calibrate(args.base_url, args.model, args.max_num_seqs, args.max_num_batched_tokens,
                                QUICK if args.quick else FULL, chunked_prefill=not args.no_chunked_prefill,
                                clock=Clock(args.clock)))
    config, check = out["config"], out["recompute"]
    residuals = np.abs(np.array(out["residuals"]))
    print(f"model {out['model']}: {config.num_gpu_blocks} blocks x {config.block_size} tokens, max_model_len "
          f"{config.max_model_len}; {len(out['samples'])} probes, model error median {100 * np.median(residuals):.1f}%"
          f", worst {100 * residuals.max():.1f}%; HTTP round trip {1000 * out['http_overhead_s']:.1f} ms")
    print("SimConfig(" + ", ".join(f"{f}={getattr(config, f):.4g}" for f in STEP_FIELDS) + ")")
    print(f"python -m terminus_env.serving.sim serve --num-gpu-blocks {config.num_gpu_blocks} --block-size "
          f"{config.block_size} --max-model-len {config.max_model_len} --max-num-seqs {config.max_num_seqs} "
          f"--max-num-batched-tokens {config.max_num_batched_tokens} {flags(config)}")
    print(f"recompute check: {check.requests} requests of {check.prompt_tokens} + {check.output_tokens} tokens: live "
          f"{check.live_s:.2f} s with {check.live_preemptions:.0f} preemptions; simulated {check.sim_s:.2f} s with "
          f"{check.sim_preemptions} ({100 * (check.sim_s / check.live_s - 1):+.1f}%); a request's mean latency by "
          f"the engine's clock: live {check.live_mean_e2e_s:.2f} s, simulated {check.sim_mean_e2e_s:.2f} s")
    if args.json:
        args.json.write_text(json.dumps({**out, "config": dataclasses.asdict(config),
                                         "samples": [dataclasses.asdict(s) for s in out["samples"]],
                                         "recompute": dataclasses.asdict(check)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
