"""Real vLLM replicas on the CPU for the tests: ``terminus-env serve`` as a process, stopped whatever a test did.

Each replica serves the tiny random Qwen2 of :mod:`terminus_env.tiny_model` in float32 and eager mode
(vLLM's CPU compilation costs half a minute per start and nothing a tiny model needs).
"""

from __future__ import annotations

from pathlib import Path

import torch

from terminus_env.serving import ReplicaClient
from terminus_env.serving.serve_process import ServeProcess, free_ports

MODEL_NAME = "tiny"
START_TIMEOUT_S = 600.0
ENGINE_ARGS = ("--enforce-eager", "--dtype", "float32", "--served-model-name", MODEL_NAME)
PROMPT = [{"role": "user", "content": " ".join(["list the files in the folder and write the output"] * 40)}]


def expected_logprobs(model, prompt_ids: list[int], token_ids: list[int]) -> torch.Tensor:
    """log p(token) at temperature 1, computed independently of vLLM."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + token_ids])).logits[0, len(prompt_ids) - 1 : -1]
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(token_ids)[:, None])[:, 0]


def perturbed(model_dir: Path, out_dir: Path, seed: int = 7):
    """What a trainer's step leaves on disk: every weight moved, saved with ``save_pretrained``; the model."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.3)
    model.save_pretrained(out_dir)
    return model


async def probe(url: str):
    """The fixed prompt on one replica, with that replica's prefix-cache hits for it."""
    async with ReplicaClient(url) as client:
        before = (await client.metrics())["0"].prefix_cache_hits_total
        c = await client.chat(MODEL_NAME, PROMPT, max_tokens=8, temperature=1.0, seed=3)
        hits = (await client.metrics())["0"].prefix_cache_hits_total - before
    return c, hits


def launch(
    model_dir: Path, log_dir: Path, *, dp: int, engine_args: tuple[str, ...] = (), serve_args: tuple[str, ...] = ()
) -> ServeProcess:
    """``terminus-env serve --dp DP`` on the CPU with ``--weight-sync``; returns once every replica answers."""
    args = ["--model", str(model_dir), "--dp", str(dp), "--port", str(free_ports(dp)), "--host", "127.0.0.1",
            "--device", "cpu", "--weight-sync", *serve_args, "--", *ENGINE_ARGS, *engine_args]  # fmt: skip
    env = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    return ServeProcess(args, log_dir, env, timeout_s=START_TIMEOUT_S).start()
