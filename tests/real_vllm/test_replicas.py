"""Real vLLM replicas on the CPU: what the launcher starts, what the engine returns, and the pool's routing on it."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import torch
from transformers import AutoModelForCausalLM
from vllm_cpu import EveryRequestRoundRobin, hit_rate
from vllm_support import MODEL_NAME

from terminus_env.serving import ReplicaClient, ServingPool
from terminus_env.serving.launcher import WHOLE_PREFILL_NOTE
from terminus_env.serving.serve_process import free_ports


def test_serve_starts_one_replica_per_core_share_and_reports_the_start_time(fleet):
    assert fleet.lines[0].startswith("terminus-env serve: 2 replica(s) of ") and " ready in " in fleet.lines[0]
    placements = [line.split("(", 1)[1] for line in fleet.lines if line.startswith("  http://")]
    assert len(placements) == 2 and all(p.startswith("CPU cores ") for p in placements)
    assert placements[0] != placements[1]  # each replica pinned to its own cores
    for url in fleet.urls:
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200
        models = httpx.get(f"{url}/v1/models", timeout=5).json()
        assert [m["id"] for m in models["data"]] == [MODEL_NAME]


def test_token_ids_prompt_ids_and_processed_logprobs(fleet, tokenizer, model_dir):
    messages = [{"role": "system", "content": "You are a shell."}, {"role": "user", "content": "list the files"}]
    temperature = 0.7

    async def ask():
        async with ReplicaClient(fleet.urls[0]) as client:
            return await client.chat(MODEL_NAME, messages, max_tokens=12, temperature=temperature, seed=1)

    c = asyncio.run(ask())
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert c.prompt_token_ids == tokenizer.encode(rendered, add_special_tokens=False)
    assert len(c.token_ids) == len(c.logprobs) == c.completion_tokens and c.prompt_tokens == len(c.prompt_token_ids)
    # The text is the ids decoded, less an incomplete UTF-8 character at the very end, which vLLM holds back.
    decoded = tokenizer.decode(c.token_ids, skip_special_tokens=True)
    assert decoded.startswith(c.text) and set(decoded[len(c.text) :]) <= {"\ufffd"}
    # processed_logprobs: the log-probabilities the tokens were sampled from, after temperature.
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = torch.tensor([c.prompt_token_ids + c.token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(c.prompt_token_ids) - 1 : -1]
    expected = torch.log_softmax(logits / temperature, dim=-1).gather(1, torch.tensor(c.token_ids)[:, None])[:, 0]
    raw = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(c.token_ids)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(c.logprobs), expected, atol=2e-3), (c.logprobs, expected.tolist())
    assert not torch.allclose(torch.tensor(c.logprobs), raw, atol=2e-3)  # the check tells the two modes apart


def test_pool_routes_on_real_metrics_keeps_sessions_sticky_and_beats_round_robin_on_prefix_hits(fleet):
    async def metrics():
        async with ServingPool(fleet.urls, MODEL_NAME) as pool:
            return pool.latest_metrics()

    scraped = asyncio.run(metrics())
    assert set(scraped) == set(fleet.urls)
    for m in scraped.values():  # the numbers available_kv placement reads
        assert m.num_gpu_blocks > 0 and m.block_size > 0 and m.kv_capacity_tokens > 8192 and m.kv_cache_usage == 0.0

    # The workload sends per-request seeds. vLLM's CPU engine crashes on a seeded request whose prefill is split over
    # steps, which depends on what shares a step (timing); `serve` starts CPU replicas with whole prefills, so the
    # seeds are safe here whatever the timing (tests/real_vllm/test_engine_death.py shows both sides).
    assert WHOLE_PREFILL_NOTE in fleet.lines
    sticky, placed = asyncio.run(hit_rate(fleet.urls, "available_kv", seed=1))
    assert all(len(set(replicas)) == 1 for replicas in placed.values()), placed  # every turn on its first replica
    assert {replicas[0] for replicas in placed.values()} == set(fleet.urls)  # and both replicas used
    round_robin, placed_rr = asyncio.run(hit_rate(fleet.urls, EveryRequestRoundRobin(), seed=1))
    assert any(len(set(replicas)) == 2 for replicas in placed_rr.values()), placed_rr  # turns moved between replicas
    print(f"\nprefix-cache hit rate on real vLLM: sticky {sticky:.3f}, round-robin {round_robin:.3f}")
    assert sticky > round_robin + 0.1, (sticky, round_robin)


def test_vllm_router_in_front_of_the_two_real_replicas(fleet, tmp_path: Path):
    exe = shutil.which("vllm-router", path=str(Path(sys.executable).parent))
    assert exe is not None, "vllm-router is not installed: it comes with the dev extra (terminus-env[routers])"
    port, metrics_port = free_ports(1), free_ports(1)
    cmd = [exe, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *fleet.urls, "--policy", "round_robin",
           "--prometheus-port", str(metrics_port), "--log-level", "warning"]  # fmt: skip
    with open(tmp_path / "router.log", "w") as log:
        router = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert router.poll() is None and time.monotonic() < deadline, (tmp_path / "router.log").read_text()
            time.sleep(0.2)

        def generated() -> list[float]:
            async def scrape():
                async with ServingPool(fleet.urls, MODEL_NAME) as pool:
                    return [pool.latest_metrics()[u].generation_tokens_total for u in fleet.urls]

            return asyncio.run(scrape())

        before = generated()
        for i in range(4):
            body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": f"hello {i}"}], "max_tokens": 5,
                    "ignore_eos": True}  # fmt: skip
            reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
            assert reply.status_code == 200, reply.text
            assert reply.json()["usage"]["completion_tokens"] == 5
        after = generated()
        assert [b - a for a, b in zip(before, after)] == [10.0, 10.0]  # round robin: two requests each
    finally:
        os.killpg(router.pid, 15)
        router.wait(timeout=30)
