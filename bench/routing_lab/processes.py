"""The benchmark's server processes: simulated vLLM replicas and the real routers in front of them.

Every process is started with ``PR_SET_PDEATHSIG`` = SIGKILL, so it dies with the benchmark even when
the benchmark is SIGKILLed, and :class:`Processes` stops each one it started on exit (SIGTERM, then
SIGKILL). The routers come from PyPI (``pip install 'terminus-env[routers]'``); their code is never
part of this repository.
"""

from __future__ import annotations

import ctypes
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from terminus_env.serving.sim.config import SimConfig, format_curve

_PR_SET_PDEATHSIG = 1
_START_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class RouterSpec:
    """One router deployment: which router, which policy, and its extra flags."""

    router: str  # "vllm-router" | "sglang-router"
    policy: str
    extra: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        suffix = "".join(f" {a}" for a in self.extra if not a.startswith("--"))
        return f"{self.router} {self.policy}{suffix}"

    @property
    def session_header(self) -> str:
        """The header each router keys sessions by (``x-session-id``; SGLang's ``manual`` policy reads its own)."""
        return "x-smg-routing-key" if self.router == "sglang-router" else "x-session-id"

    @property
    def finishes_sessions(self) -> bool:
        """Whether the client tells the router a session ended (``POST /finish_session?session_id=``), as
        vllm-router's users do: ``sticky_least_loaded`` then counts live sessions, not every session it was
        ever given; policies that keep no sessions answer it and ignore it."""
        return self.router == "vllm-router"


def versions() -> dict[str, str]:
    """The installed routers' versions, for the report."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("vllm-router", "sglang-router"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """Runs in the child before exec: the kernel SIGKILLs it when the benchmark process goes away."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Processes:
    """``with Processes(log_dir) as procs:`` start replicas and routers; all are stopped on exit."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self._procs: list[subprocess.Popen] = []

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop_all()

    def _spawn(self, cmd: Sequence[str], log_name: str) -> subprocess.Popen:
        with open(self.log_dir / log_name, "w") as log:  # the child keeps its own descriptor
            proc = subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        self._procs.append(proc)
        return proc

    def replicas(self, count: int, engine: SimConfig, time_scale: float, replies: Path, model: str,
                 tokenizer: Path | None = None, weight_sync: bool = False) -> list[str]:
        """``count`` simulated replicas, each its own process; their URLs once every one answers ``/health``.
        With ``tokenizer`` (a Hugging Face folder) they count tokens as a real server of that model does; with
        ``weight_sync`` they serve vLLM's development endpoints (``/reset_prefix_cache`` among them)."""
        urls = []
        for i in range(count):
            port = free_port()
            flags = [engine_flag(name, value) for name, value in vars(engine).items()]
            if tokenizer is not None:
                flags += ["--tokenizer", str(tokenizer)]
            if weight_sync:
                flags.append("--weight-sync")
            cmd = [sys.executable, "-m", "terminus_env.serving.sim", "serve", "--port", str(port), "--model", model,
                   "--time-scale", str(time_scale), "--replies", str(replies), *flags]
            self._spawn(cmd, f"replica-{i}-{port}.log")
            urls.append(f"http://127.0.0.1:{port}")
        for url in urls:
            wait_healthy(url, self._procs)
        return urls

    def router(self, spec: RouterSpec, workers: Sequence[str]) -> str:
        """One router process in front of ``workers``; its URL once it routes a request."""
        port, metrics_port = free_port(), free_port()
        common = ["--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers, "--policy", spec.policy,
                  "--prometheus-port", str(metrics_port)]
        if spec.router == "vllm-router":
            exe = shutil.which("vllm-router", path=str(Path(sys.executable).parent)) or "vllm-router"
            cmd = [exe, *common, "--log-level", "warning", *spec.extra]
        elif spec.router == "sglang-router":
            cmd = [sys.executable, "-m", "sglang_router.launch_router", *common, "--log-level", "warn", *spec.extra]
        else:
            raise ValueError(f"unknown router {spec.router!r}: vllm-router or sglang-router")
        self._spawn(cmd, f"{spec.label.replace(' ', '_')}-{port}.log")
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, self._procs, path="/v1/models")
        return url

    def stop_all(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + _STOP_TIMEOUT_S
        for proc in self._procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._procs.clear()


def wait_healthy(url: str, procs: Sequence[subprocess.Popen], path: str = "/health") -> None:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        dead = [p for p in procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"{' '.join(map(str, dead[0].args[:3]))} exited with {dead[0].returncode}; "
                               "see its log in the benchmark's log folder")
        try:
            if httpx.get(url + path, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url}{path} did not answer in {_START_TIMEOUT_S:.0f}s")


def engine_flag(name: str, value: object) -> str:
    """One :class:`SimConfig` setting as the simulated server's flag."""
    flag = name.replace("_", "-")
    if isinstance(value, bool):
        return f"--{'' if value else 'no-'}{flag}"
    return f"--{flag}={format_curve(value) if isinstance(value, tuple) else value}"
