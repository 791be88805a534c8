"""Real vLLM replicas on the CPU for the tests: ``terminus-env serve`` as a process, stopped whatever a test did.

Each replica serves the tiny random Qwen2 of :mod:`terminus_env.cli.tiny_model`, cut to one layer (``MODEL``: it decodes
half again as fast as the default two, and the tests need no more), in float32 and eager mode (vLLM's CPU compilation
costs half a minute per start and nothing a tiny model needs).

The bounds here only stop a hung test; none is a speed the tests expect. A replica starts in 40-100 s on the shared
2-core machine (``START_TIMEOUT_S`` allows four times that), and a test that starts a fleet or waits for a restarted
replica is given ``TEST_TIMEOUT_S`` by pytest-timeout, above its own bounds.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import torch
from task_support import write_task

from terminus_env.cli.tiny_model import TinyModelConfig
from terminus_env.serving import ReplicaClient
from terminus_env.serving.serve_process import ServeProcess, free_ports

MODEL = TinyModelConfig(num_hidden_layers=1)
MODEL_NAME = "tiny"
START_TIMEOUT_S = 400.0  # a fleet's start, or a restarted replica's, until it answers
TEST_TIMEOUT_S = 1200  # pytest-timeout for a test that may start a fleet and wait for a restart besides its own work
ENGINE_ARGS = ("--enforce-eager", "--dtype", "float32", "--served-model-name", MODEL_NAME)
PROMPT = [{"role": "user", "content": " ".join(["list the files in the folder and write the output"] * 40)}]
SMALL_CONTEXT = 1024  # the small fleet's context
SMALL_KV_BLOCKS = 48  # the small fleet's KV cache, in blocks of 32 tokens: one request fills at most 32 of them
SPLIT_BUDGET = 256  # the small fleet's step budget: any longer prompt is prefilled in parts
EVAL_AGENT_TIMEOUT_S = 45  # an eval that runs until its task's time is up: its first summary came 5-8 s in, at load 30


def eval_suite(root: Path, name: str) -> Path:
    """A suite of one small task (write a word into a file) whose time is ``EVAL_AGENT_TIMEOUT_S``; its folder."""
    toml = write_task(root, name) / "task.toml"
    toml.write_text(toml.read_text().replace("timeout_sec = 300", f"timeout_sec = {EVAL_AGENT_TIMEOUT_S}"))
    return root


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
    model_dir: Path,
    log_dir: Path,
    *,
    dp: int,
    engine_args: tuple[str, ...] = (),
    serve_args: tuple[str, ...] = (),
    port: int | None = None,
    base_args: tuple[str, ...] = ENGINE_ARGS,
) -> ServeProcess:
    """``terminus-env serve --dp DP`` on the CPU with ``--weight-sync``; returns once every replica answers. vLLM is
    given ``base_args`` (eager, float32, the model's name), then ``engine_args``."""
    port = free_ports(dp) if port is None else port
    args = ["--model", str(model_dir), "--dp", str(dp), "--port", str(port), "--host", "127.0.0.1",
            "--device", "cpu", "--weight-sync", *serve_args, "--", *base_args, *engine_args]  # fmt: skip
    env = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    return ServeProcess(args, log_dir, env, timeout_s=START_TIMEOUT_S).start()


def wait_serving(fleet: ServeProcess) -> None:
    """Until every replica of ``fleet`` answers ``/health`` (one its launcher is restarting comes back); an error
    after ``START_TIMEOUT_S``, or at once if the launcher is gone."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while not all(answers(url) for url in fleet.urls):
        assert fleet.proc is not None and fleet.proc.poll() is None, fleet.launcher_log()[-3000:]
        assert time.monotonic() < deadline, f"{fleet.urls}: one did not come back; {fleet.launcher_log()[-3000:]}"
        time.sleep(1)


def answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False
