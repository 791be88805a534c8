"""The replica processes of ``terminus-env serve``: start each, wait until all answer, watch them (a replica that
dies is started again while the others serve), and stop them together.

Each replica runs in its own process group, so stopping it reaches the engine and worker processes vLLM forks,
and gets SIGTERM if the launcher is killed outright.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx

from terminus_env.errors import TerminusError
from terminus_env.serving.weight_sync import BROKEN_TAG
from terminus_env.utils.process_group import end_group

KILL_WAIT_S = 30.0  # for every process of a SIGKILLed replica to be gone
WEIGHT_TAG_POLL_S = 2.0  # how often the launcher reads each replica's weight version (with --weight-sync)


class LaunchError(TerminusError):
    """The replicas cannot be started as asked; the message says what to change."""


@dataclass(frozen=True)
class Replica:
    index: int
    port: int
    gpus: tuple[str, ...]  # empty on the CPU
    argv: tuple[str, ...]
    cpus: tuple[int, ...] = ()  # the cores a CPU replica is pinned to
    env: Mapping[str, str] = field(default_factory=dict)  # variables set for this replica
    seed: int = 0  # vLLM's --seed: the launcher's base + the replica's index, a fresh one on each start again

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def placement(self) -> str:
        where = f"GPUs {','.join(self.gpus)}" if self.gpus else f"CPU cores {id_list(self.cpus)}"
        return f"{where}, seed {self.seed}"

    def reseeded(self, seed: int) -> Replica:
        """The same replica with another sampling seed (for a start again: a seed no replica had yet)."""
        argv = list(self.argv)
        argv[argv.index("--seed") + 1] = str(seed)
        return replace(self, argv=tuple(argv), seed=seed)


def id_list(ids: Sequence[int]) -> str:
    """Core ids as vLLM's binding variable takes them: ``0-3`` for a run, ``0,2`` otherwise."""
    ids = list(ids)
    if ids and ids == list(range(ids[0], ids[-1] + 1)) and len(ids) > 1:
        return f"{ids[0]}-{ids[-1]}"
    return ",".join(map(str, ids))


def start(replica: Replica, log_dir: Path | None) -> subprocess.Popen:
    env = {**os.environ, **replica.env}
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
    log = open(log_dir / f"replica-{replica.index}.log", "ab") if log_dir else contextlib.nullcontext()  # noqa: SIM115
    with log as out:  # the child keeps its own copy of the descriptor
        # Its own process group, so stopping it reaches the engine and worker processes vLLM forks.
        return subprocess.Popen(
            replica.argv,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT if out else None,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 (the launcher runs no threads)
        )


def _die_with_parent() -> None:
    """Linux: the replica gets SIGTERM if the launcher is killed outright (no orphans even then)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def wait_healthy(replicas: list[Replica], procs: list[subprocess.Popen], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    pending = list(replicas)
    with httpx.Client(timeout=2.0) as http:
        while pending:
            check_alive(replicas, procs, "while starting")
            pending = [r for r in pending if not _healthy(http, r.url)]
            if pending and time.monotonic() > deadline:
                raise LaunchError(
                    f"replica(s) {', '.join(r.url for r in pending)} not healthy after {timeout_s:.0f}s "
                    "(raise --startup-timeout-s for large models, or see their logs)"
                )
            if pending:
                time.sleep(0.5)


def _healthy(http: httpx.Client, url: str) -> bool:
    try:
        return http.get(f"{url}/health").status_code == 200
    except httpx.HTTPError:
        return False


def check_alive(replicas: list[Replica], procs: list[subprocess.Popen], when: str) -> None:
    for replica, proc in zip(replicas, procs):
        code = proc.poll()
        if code is not None:
            raise LaunchError(f"replica {replica.index} (port {replica.port}) exited with code {code} {when}")


def watch(
    replicas: list[Replica], procs: list[subprocess.Popen], max_restarts: int, log_dir: Path | None,
    *, weight_sync: bool = False, seed: int = 0,
) -> int:  # fmt: skip
    """Serve until Ctrl-C / SIGTERM (raised out of here). A replica that dies is started again, up to
    ``max_restarts`` times, while the others keep serving; when none is left, return 1. With ``weight_sync``, a
    replica tagged broken by a failed weight load is started again too (not counted: it did not crash). Each start
    again takes the next seed after ``seed`` that no start of this launcher had."""
    restarts = [0] * len(replicas)
    starts = len(replicas)  # every start so far, for the next seed
    gone: set[int] = set()
    next_poll = time.monotonic() + WEIGHT_TAG_POLL_S
    with httpx.Client(timeout=WEIGHT_TAG_POLL_S) as http:
        while len(gone) < len(replicas):
            broken = set()
            if weight_sync and time.monotonic() >= next_poll:
                broken = {i for i, r in enumerate(replicas) if i not in gone and _tagged_broken(http, r.url)}
                next_poll = time.monotonic() + WEIGHT_TAG_POLL_S
            for i, (replica, proc) in enumerate(zip(replicas, procs)):
                code = proc.poll()
                if i in gone or (code is None and i not in broken):
                    continue
                end_group(proc.pid, KILL_WAIT_S)  # what vLLM forked outlives the API server, holding its memory and log
                proc.wait()
                if code is None:
                    what = f"terminus-env serve: replica {replica.index} ({replica.url}) failed to load weights and " \
                           "could not take the last good ones back"  # fmt: skip
                    print(f"{what}; starting it again, the others keep serving", file=sys.stderr, flush=True)
                else:
                    what = f"terminus-env serve: replica {replica.index} ({replica.url}) exited with code {code} " \
                           "while serving"  # fmt: skip
                    if restarts[i] >= max_restarts:
                        gone.add(i)
                        left = len(replicas) - len(gone)
                        print(f"{what}; not restarted again ({max_restarts} restarts); {left} replica(s) left",
                              file=sys.stderr)  # fmt: skip
                        continue
                    restarts[i] += 1
                    print(f"{what}; starting it again ({restarts[i]} of {max_restarts}), the others keep serving",
                          file=sys.stderr, flush=True)  # fmt: skip
                replicas[i] = replica.reseeded(seed + starts)
                starts += 1
                procs[i] = start(replicas[i], log_dir)
            time.sleep(0.5)
    print("terminus-env serve: no replica is left", file=sys.stderr)
    return 1


def _tagged_broken(http: httpx.Client, url: str) -> bool:
    """Whether the replica says it failed to load weights and could not take the last good ones back."""
    try:
        return http.get(f"{url}/weight_info").json().get("weight_version") == BROKEN_TAG
    except (httpx.HTTPError, ValueError, AttributeError):
        return False  # starting, or not answering: the process watch handles a replica that died


def stop_all(procs: list[subprocess.Popen], timeout_s: float) -> None:
    """SIGTERM every replica's process group, wait, then SIGKILL what is left of each group and wait until none of
    it is alive: a worker that outlived its leader may still write to the replica's log or caches, which the caller
    may remove as soon as this returns."""
    for proc in procs:
        _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for proc in procs:
        left = end_group(proc.pid, KILL_WAIT_S)  # stragglers, including workers whose leader already exited
        proc.wait()
        if left:
            print(f"terminus-env serve: processes {left} of replica pid {proc.pid} outlived SIGKILL for "
                  f"{KILL_WAIT_S:.0f}s", file=sys.stderr)  # fmt: skip


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
