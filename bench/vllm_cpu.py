"""Real vLLM on this machine's CPU, with the tiny random Qwen2: the numbers docs/notes/real-vllm.md reports.

- replica start time: ``terminus-env serve --dp 2`` until both answer ``/health``, eager (``--enforce-eager``) and,
  with ``--compiled``, with vLLM's default torch.compile (whose cache a second start reuses);
- decode tokens/s per replica: 8 requests of 256 tokens at once on one replica, then on both together;
- prefix-cache hit rate of one multi-turn workload placed by the pool (sticky sessions) and by round robin over
  requests, from the replicas' own ``vllm:prefix_cache_*`` counters;
- weight-sync time: ``ServingPool.sync_weights`` reloading the model from disk into both replicas, and, with
  ``--sync-scaling``, into one replica of a 124M-parameter model of the same family (what the time per billion
  parameters comes from: the tiny model's load is all fixed cost).

The baseline is the previous run's JSON (``--baseline``): each number is printed beside it. Needs .venv-vllm
(``make test-vllm`` installs it)::

    .venv-vllm/bin/python bench/vllm_cpu.py --json vllm-cpu.json [--baseline old.json] [--compiled] [--sync-scaling]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from terminus_env.serving import ReplicaClient, ServingPool
from terminus_env.serving.policies import RoundRobin
from terminus_env.serving.serve_process import ServeProcess, free_ports
from terminus_env.serving.weight_sync import CheckpointReload

MODEL = "tiny"
ENGINE_ARGS = ["--dtype", "float32", "--served-model-name", MODEL, "--max-model-len", "8192"]
FILLER = ["shell", "file", "write", "list", "error", "task", "output", "path", "hello", "config", "run", "test"]


class EveryRequestRoundRobin(RoundRobin):
    """Round robin over requests, not sessions: a session's turns go from replica to replica."""

    name = "round_robin_per_request"
    sticky = False


def words(n: int, seed: int) -> str:
    """``n`` words of filler, different per seed, so that prompts span several KV blocks."""
    return " ".join(FILLER[(seed * 7 + i * i) % len(FILLER)] for i in range(n))


async def sessions(pool: ServingPool, n_sessions: int, turns: int, seed: int) -> dict[str, list[str]]:
    """``n_sessions`` concurrent multi-turn chats (a 300-word system prompt, 30 words a turn); the replica of each
    session's turns."""

    async def one(i: int) -> list[str]:
        sid = f"s{seed}-{i}"
        messages = [{"role": "system", "content": words(300, i)}, {"role": "user", "content": words(40, i + 1)}]
        seen = []
        async with pool.session(sid):
            for turn in range(turns):
                c = await pool.chat(sid, messages, max_tokens=16, temperature=1.0, seed=turn)
                seen.append(c.replica)
                messages += [{"role": "assistant", "content": c.text},
                             {"role": "user", "content": words(30, 100 * i + turn)}]  # fmt: skip
        return seen

    results = await asyncio.gather(*(one(i) for i in range(n_sessions)))
    return {f"s{seed}-{i}": r for i, r in enumerate(results)}


async def hit_rate(urls: list[str], policy, seed: int) -> tuple[float, dict[str, list[str]]]:
    """Prefix-cache hit rate (Δhits / Δqueries over the replicas' /metrics) of the workload placed by ``policy``,
    every prefix cache reset first."""
    async with ServingPool(urls, MODEL, policy=policy, scrape_interval_s=0.5) as pool:
        for url in urls:
            async with ReplicaClient(url) as client:
                await client.reset_prefix_cache()
        before = await _counters(urls)
        placed = await sessions(pool, n_sessions=6, turns=4, seed=seed)
    after = await _counters(urls)
    hits = sum(after[u][0] - before[u][0] for u in urls)
    queries = sum(after[u][1] - before[u][1] for u in urls)
    return hits / queries, placed


async def _counters(urls: list[str]) -> dict[str, tuple[float, float]]:
    out = {}
    for url in urls:
        async with ReplicaClient(url) as client:
            m = (await client.metrics())["0"]
        out[url] = (m.prefix_cache_hits_total, m.prefix_cache_queries_total)
    return out


async def decode_rate(urls: list[str], concurrency: int = 8, tokens: int = 256) -> float:
    """Generated tokens per second with ``concurrency`` requests of ``tokens`` tokens on each of ``urls`` at once."""
    clients = [ReplicaClient(url) for url in urls]
    try:
        await asyncio.gather(*(c.chat(MODEL, [{"role": "user", "content": "warm"}], max_tokens=4) for c in clients))
        started = time.perf_counter()
        done = await asyncio.gather(*(
            c.chat(MODEL, [{"role": "user", "content": f"request {i}"}], max_tokens=tokens, ignore_eos=True,
                   logprobs=False)
            for c in clients for i in range(concurrency)
        ))  # fmt: skip
        return sum(d.completion_tokens for d in done) / (time.perf_counter() - started)
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))


async def weight_sync(urls: list[str], checkpoint: Path, rounds: int = 3) -> list[dict]:
    out = []
    async with ServingPool(urls, MODEL) as pool:
        for version in range(1, rounds + 1):
            report = await pool.sync_weights(CheckpointReload(str(checkpoint)), version)
            out.append({"held_s": report.held_s, "load_s": report.load_s})
    return out


# A model of the tiny one's family big enough that loading it costs more than the calls around it: 124M parameters.
MEDIUM = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 8, "num_attention_heads": 16,
          "num_key_value_heads": 4}  # fmt: skip


def serve(model_dir: Path, log_dir: Path, compiled: bool, dp: int = 2) -> ServeProcess:
    eager = [] if compiled else ["--enforce-eager"]
    args = ["--model", str(model_dir), "--dp", str(dp), "--port", str(free_ports(dp)), "--host", "127.0.0.1",
            "--device", "cpu", "--weight-sync", "--", *ENGINE_ARGS, *eager]  # fmt: skip
    env = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    return ServeProcess(args, log_dir, env).start()


def measure(work: Path, compiled: bool) -> dict:
    from terminus_env.cli.tiny_model import save_tiny_model

    model_dir = save_tiny_model(work / "tiny")
    served = serve(model_dir, work / ("logs-compiled" if compiled else "logs"), compiled)
    try:
        urls = served.urls
        per_replica = [asyncio.run(decode_rate([url])) for url in urls]
        both = asyncio.run(decode_rate(urls))
        sticky, _ = asyncio.run(hit_rate(urls, "available_kv", seed=1))
        round_robin, _ = asyncio.run(hit_rate(urls, EveryRequestRoundRobin(), seed=1))
        syncs = asyncio.run(weight_sync(urls, model_dir))
    finally:
        served.stop()
    return {
        "torch_compile": compiled,
        "load_average_1m": os.getloadavg()[0],
        "start_s": served.startup_s,
        "decode_tokens_per_s_per_replica_alone": per_replica,
        "decode_tokens_per_s_both_replicas": both,
        "prefix_hit_rate_sticky": sticky,
        "prefix_hit_rate_round_robin_per_request": round_robin,
        "checkpoint_bytes": (model_dir / "model.safetensors").stat().st_size,
        "weight_sync": syncs,
    }


def sync_scaling(work: Path) -> dict:
    """Save (as a trainer does) and load into one replica a 124M-parameter model, three times."""
    import torch
    from transformers import AutoModelForCausalLM

    from terminus_env.cli.tiny_model import TinyModelConfig, save_tiny_model

    model_dir = save_tiny_model(work / "medium", config=TinyModelConfig(**MEDIUM))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    served = serve(model_dir, work / "logs-medium", compiled=False, dp=1)
    rounds = []
    try:
        for step in range(3):
            started = time.perf_counter()
            model.save_pretrained(work / f"medium-step-{step}")
            save_s = time.perf_counter() - started
            (sync,) = asyncio.run(weight_sync(served.urls, work / f"medium-step-{step}", rounds=1))
            rounds.append({"save_s": save_s, **sync})
    finally:
        served.stop()
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "checkpoint_bytes": (work / "medium-step-0" / "model.safetensors").stat().st_size,
        "rounds": rounds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="write the numbers here")
    parser.add_argument("--baseline", type=Path, help="an earlier run's JSON to print beside this one")
    parser.add_argument("--compiled", action="store_true", help="also start the replicas with torch.compile")
    parser.add_argument("--sync-scaling", action="store_true", help="also time syncs of a 124M-parameter model")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="vllm-cpu-") as tmp:
        runs = [measure(Path(tmp), compiled=False)]
        if args.compiled:
            runs.append(measure(Path(tmp), compiled=True))
        scaling = sync_scaling(Path(tmp)) if args.sync_scaling else None
    baseline = json.loads(args.baseline.read_text()) if args.baseline else None
    for i, run in enumerate(runs):
        before = baseline["runs"][i] if baseline and i < len(baseline["runs"]) else {}
        print(f"== torch.compile: {run['torch_compile']} (1-min load average {run['load_average_1m']:.1f})")
        for key, value in run.items():
            if key not in ("torch_compile", "load_average_1m"):
                print(f"  {key:45} {json.dumps(value)}" + (f"   (baseline {json.dumps(before[key])})"
                                                            if key in before else ""))  # fmt: skip
    if scaling is not None:
        loads = [r["load_s"] for r in scaling["rounds"]]
        per_billion = min(loads) * 1e9 / scaling["parameters"]
        print(f"== sync of {scaling['parameters'] / 1e6:.0f}M parameters ({scaling['checkpoint_bytes'] / 1e6:.0f} MB): "
              f"{json.dumps(scaling['rounds'])}; load {per_billion:.1f} s per billion float32 parameters")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "sync_scaling": scaling}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
