"""Real vLLM replicas on the CPU for the tests: ``terminus-env serve`` as a process, stopped whatever a test did.

Each replica serves the tiny random Qwen2 of :mod:`terminus_env.serving.tiny_model` in float32 and eager mode
(vLLM's CPU compilation costs half a minute per start and nothing a tiny model needs).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import torch

from terminus_env.serving import ReplicaClient

MODEL_NAME = "tiny"
START_TIMEOUT_S = 600.0
ENGINE_ARGS = ("--enforce-eager", "--dtype", "float32", "--served-model-name", MODEL_NAME)
_PID = re.compile(r"APIServer pid=(\d+)")
PROMPT = [{"role": "user", "content": " ".join(["list the files in the folder and write the output"] * 40)}]


def expected_logprobs(model, prompt_ids: list[int], token_ids: list[int]) -> torch.Tensor:
    """log p(token) at temperature 1, computed independently of vLLM."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + token_ids])).logits[0, len(prompt_ids) - 1 : -1]
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(token_ids)[:, None])[:, 0]


async def probe(url: str):
    """The fixed prompt on one replica, with that replica's prefix-cache hits for it."""
    async with ReplicaClient(url) as client:
        before = (await client.metrics())["0"].prefix_cache_hits_total
        c = await client.chat(MODEL_NAME, PROMPT, max_tokens=8, temperature=1.0, seed=3)
        hits = (await client.metrics())["0"].prefix_cache_hits_total - before
    return c, hits


@dataclass
class Fleet:
    """One ``terminus-env serve`` process and its replicas."""

    proc: subprocess.Popen
    urls: list[str]
    startup_s: float
    lines: list[str]
    log_dir: Path

    def replica_pid(self, index: int) -> int:
        """The API server's pid, from its log: the leader of the replica's process group."""
        match = _PID.search((self.log_dir / f"replica-{index}.log").read_text())
        if match is None:
            raise AssertionError(f"no APIServer pid in replica-{index}.log")
        return int(match.group(1))

    def launcher_log(self) -> str:
        return (self.log_dir / "serve.err").read_text()

    def stop(self) -> None:
        """SIGTERM the launcher (it stops its replicas), then check every replica port is closed."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        deadline = time.monotonic() + 30
        while any(_answers(url) for url in self.urls):
            if time.monotonic() > deadline:
                raise AssertionError(f"a replica still answers after its launcher stopped: {self.urls}")
            time.sleep(0.5)


def free_ports(n: int) -> int:
    """A base port with ``n`` free ports after it."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n < 65535 and all(_port_free(base + i) for i in range(n)):
            return base
    raise RuntimeError("no run of free ports")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _answers(url: str) -> bool:
    try:
        httpx.get(f"{url}/health", timeout=1.0)
    except httpx.HTTPError:
        return False
    return True


def launch(model_dir: Path, log_dir: Path, *, dp: int, serve_args: tuple[str, ...] = (),
           engine_args: tuple[str, ...] = ()) -> Fleet:  # fmt: skip
    """``terminus-env serve --dp DP`` on the CPU; returns once every replica answers ``/health``."""
    port = free_ports(dp)
    cmd = [sys.executable, "-m", "terminus_env.cli", "serve", "--model", str(model_dir), "--dp", str(dp),
           "--port", str(port), "--host", "127.0.0.1", "--device", "cpu", "--weight-sync", "--log-dir", str(log_dir),
           *serve_args, "--", *ENGINE_ARGS, *engine_args]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1"}
    started = time.monotonic()
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / "serve.err", "w") as err:  # the launcher's own messages: why it stopped, if it did
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
    lines: list[str] = []
    fleet = Fleet(proc, [f"http://127.0.0.1:{port + i}" for i in range(dp)], 0.0, lines, log_dir)
    try:
        while True:
            line = proc.stdout.readline()
            if not line:
                raise AssertionError(f"terminus-env serve exited (rc={proc.wait()}): {fleet.launcher_log()[-3000:]}")
            lines.append(line.rstrip())
            if line.startswith("evaluate with:"):
                break
            if time.monotonic() - started > START_TIMEOUT_S:
                raise AssertionError(f"replicas not ready in {START_TIMEOUT_S:.0f}s: {lines}")
    except BaseException:
        fleet.stop()
        raise
    fleet.startup_s = time.monotonic() - started
    return fleet
