"""Helpers for the serving tests: simulated vLLM servers as real processes on 127.0.0.1."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

_LISTENING = re.compile(r"on (http://127\.0\.0\.1:\d+)")


class SimProcesses:
    """Starts ``python -m terminus_env.serving.sim serve`` processes and kills every one in ``close``."""

    def __init__(self, log_dir: Path) -> None:
        self._log_dir = log_dir
        self.procs: list[subprocess.Popen] = []

    def start(self, *args: str, port: int = 0) -> tuple[subprocess.Popen, str]:
        cmd = [sys.executable, "-m", "terminus_env.serving.sim", "serve", "--port", str(port), *args]
        log = self._log_dir / f"sim-{len(self.procs)}.log"
        with open(log, "w") as stderr:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True)
        self.procs.append(proc)
        line = proc.stdout.readline()  # the server prints its URL once it listens
        match = _LISTENING.search(line)
        if match is None:
            raise RuntimeError(f"sim server did not start: {line!r}; see {log.name}")
        return proc, match.group(1)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
            if proc.stdout is not None:
                proc.stdout.close()


def wait_healthy(url: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not become healthy in {timeout_s}s")


async def until(condition: Callable[[], bool], what: str, timeout_s: float = 120.0) -> None:
    """Wait for ``condition``, a state the code under test shows, looking every 10 ms. ``timeout_s`` only ends a test
    that hangs: it is far beyond what any host takes, busy or not."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:g} s")
        await asyncio.sleep(0.01)


def running_at(*servers: object) -> int:
    """Requests running in the engines of these simulated servers (``SimServer``) now."""
    return sum(int(replica.metrics().num_requests_running) for server in servers for replica in server.replicas)  # type: ignore[attr-defined]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def terminate(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# A checkpoint's tensors as `save_pretrained` names them, small enough to write by hand (the weights themselves
# are zeros: the simulated replicas load nothing, and the checks read only names, shapes and file lengths).
TINY_SHAPES = {
    "model.embed_tokens.weight": (32, 8),
    "model.layers.0.self_attn.q_proj.weight": (8, 8),
    "model.layers.0.mlp.down_proj.weight": (8, 16),
    "model.norm.weight": (8,),
    "lm_head.weight": (32, 8),
}


def write_checkpoint(
    folder: Path, shapes: dict[str, tuple[int, ...]] = TINY_SHAPES, *, architecture: str = "Qwen2ForCausalLM",
    cut_bytes: int = 0,
) -> Path:  # fmt: skip
    """A Hugging Face checkpoint folder: ``config.json`` and one safetensors file of float32 zeros, written as the
    format lays it out (an 8-byte header length, the JSON header, the data), ``cut_bytes`` short at the end."""
    import json
    import math
    import struct

    folder.mkdir(parents=True, exist_ok=True)
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 4 * math.prod(shape)
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    data = struct.pack("<Q", len(encoded)) + encoded + bytes(offset)
    (folder / "model.safetensors").write_bytes(data[: len(data) - cut_bytes])
    (folder / "config.json").write_text(json.dumps({"architectures": [architecture], "tie_word_embeddings": False}))
    return folder
