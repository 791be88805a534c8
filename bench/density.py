"""One sandbox host at its limits: what an idle sandbox costs it, how many live ones it holds, and how fast it
absorbs a burst of starts; each against a baseline measured in the same run.

Usage: .venv/bin/python bench/density.py [--parts idle,ramp,burst] [--where local,ray] [--idle 32]
           [--levels 25,50,100,150,200,250,300] [--window 60] [--interval 10] [--busy 2] [--burn 3]
           [--past-p99] [--floor-gib 4] [--burst 64]

DOCKER_HOST picks the engine (its dockerd must run on this machine: its CPU is read from /proc). Through Ray, a local
one-node cluster offers the slots, so the host actor runs on this machine too.

1. Idle cost: --idle sandboxes with nothing running, measured in windows taken in turn, --rounds times: as shipped
   (one disk watch per process walks every layer once a second); with the watch's fallback added (one
   `containers(size=True)` call per second for all of them, what an engine this process cannot read costs); and with
   the per-sandbox poll the watch replaced added (each sandbox asking Docker for its own size every second). Host CPU
   per sandbox, by part: this process, dockerd, containerd, the shims, the containers.
2. Ramp: live sandboxes (locally, then through one Ray host), each an env stepping `echo hi` once per --interval s
   at its own phase; --busy of them burn a core for --burn s at each of their steps instead. Levels go up until step
   p99 passes 50 ms (with --past-p99: noted, and on), something fails, or the machine's available memory would fall
   under --floor-gib. Per level: step p50/p99 (the busy ones' steps apart), CPU by part, host memory, what broke.
3. Burst: --burst starts of one image, cold (no warm sandbox), to all ready, locally and through one Ray host,
   against the same burst taken from warm sandboxes (SandboxPool's and FleetConfig's ``warm_per_spec``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from typing import Any

import docker
from host import Engine, container_cpu_s, cpu_s, host_memory_gib, shim_pids
from timing import pct

from terminus_env.env import TerminusEnv
from terminus_env.sandbox import BASE_IMAGE, Sandbox, SandboxPool, SandboxSpec
from terminus_env.sandbox.disk import DISK_POLL_S, disk_watch
from terminus_env.tasks import find_task

SPEC = SandboxSpec(BASE_IMAGE)
P99_LIMIT_S = 0.050
SHIPPED = "as shipped: one watch walks every layer"
BEFORE = "+ each sandbox asks Docker (before)"
START_AT_ONCE = 8  # starts in flight while a level fills up


def reply(keystrokes: str, duration: float) -> str:
    return (
        "<response><analysis>a</analysis><plan>p</plan>"
        f'<commands><keystrokes duration="{duration}">{keystrokes}</keystrokes></commands></response>'
    )


def row(label: str, *cells: str) -> None:
    print(f"  {label:<46}" + "".join(f"{cell:>13}" for cell in cells), flush=True)


def level_row(*cells: str) -> None:
    print("  " + "".join(f"{cell:>10}" for cell in cells), flush=True)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


@dataclass
class Parts:
    """CPU seconds so far of each part of the host (or, as a difference, over a window)."""

    owner: float
    dockerd: float
    containerd: float
    shims: float
    containers: float

    @classmethod
    def sample(cls, engine: Engine, owner_pid: int | None, ids: list[str], shims: list[int]) -> Parts:
        owner = time.process_time() if owner_pid is None else cpu_s(owner_pid)
        return cls(
            owner, cpu_s(engine.dockerd), cpu_s(engine.containerd) if engine.containerd else 0.0,
            sum(cpu_s(pid) for pid in shims), container_cpu_s(ids) or 0.0,
        )  # fmt: skip

    def __sub__(self, other: Parts) -> Parts:
        return Parts(*(getattr(self, f.name) - getattr(other, f.name) for f in fields(self)))

    def scaled(self, factor: float) -> Parts:
        return Parts(*(getattr(self, f.name) * factor for f in fields(self)))

    @property
    def total(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))

    def cells(self, unit: str) -> list[str]:
        return [f"{getattr(self, f.name):.{3 if unit == 'cores' else 2}f}" for f in fields(self)] + [
            f"{self.total:.{3 if unit == 'cores' else 2}f}"
        ]


PART_NAMES = [f.name for f in fields(Parts)] + ["total"]


async def at_most(limit: int, jobs: list[Callable[[], Awaitable[Any]]]) -> list[Any]:
    """Run the jobs, ``limit`` at a time; results (or exceptions) in order."""
    gate = asyncio.Semaphore(limit)

    async def one(job: Callable[[], Awaitable[Any]]) -> Any:
        async with gate:
            return await job()

    return list(await asyncio.gather(*(one(job) for job in jobs), return_exceptions=True))


# ----- 1. idle cost -------------------------------------------------------------------------------------------
async def idle_cost(client: docker.DockerClient, engine: Engine, count: int, window_s: float, rounds: int) -> None:
    print(f"1. Idle cost: {count} idle sandboxes, {window_s:g} s windows in turn, median of {rounds} rounds")
    started = await at_most(START_AT_ONCE, [lambda: Sandbox.start(SPEC, client=client)] * count)
    sandboxes = [s for s in started if isinstance(s, Sandbox)]
    try:
        if len(sandboxes) < count:
            raise RuntimeError(f"only {len(sandboxes)} of {count} started: {started}")
        ids = [s.id for s in sandboxes]
        shims = shim_pids(ids)
        watch = disk_watch(client, sandboxes[0]._layer.engine)  # noqa: SLF001 - the watch the sandboxes are on
        unread = [replace(s._layer, upper_dir=None) for s in sandboxes]  # noqa: SLF001

        async def fallback() -> None:  # what the watch does for layers it cannot read: one call for all
            while True:
                await asyncio.to_thread(watch.measure_all, unread)
                await asyncio.sleep(DISK_POLL_S)

        async def per_sandbox() -> None:  # what each sandbox did before: ask Docker for its own size
            async def one(container_id: str) -> None:
                while True:
                    await asyncio.to_thread(client.api.containers, all=True, size=True, filters={"id": container_id})
                    await asyncio.sleep(DISK_POLL_S)

            await asyncio.gather(*(one(container_id) for container_id in ids))

        modes: dict[str, Callable[[], Awaitable[None]] | None] = {
            SHIPPED: None,
            "+ one Docker call per second for all": fallback,
            BEFORE: per_sandbox,
        }
        results: dict[str, list[Parts]] = {mode: [] for mode in modes}
        for _ in range(rounds):
            for mode, extra in modes.items():
                task = asyncio.ensure_future(extra()) if extra else None
                await asyncio.sleep(2)
                before = Parts.sample(engine, None, ids, shims)
                await asyncio.sleep(window_s)
                results[mode].append((Parts.sample(engine, None, ids, shims) - before).scaled(1000 / window_s / count))
                if task is not None:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
        row("host CPU per idle sandbox, ms/s", *PART_NAMES)
        medians = {}
        for mode, samples in results.items():
            medians[mode] = Parts(*(statistics.median(getattr(s, name) for s in samples) for name in PART_NAMES[:-1]))
            row(mode, *medians[mode].cells("ms"))
        shipped_layers = [s._layer for s in sandboxes]  # noqa: SLF001
        walked = [replace(layer, enforced=False) for layer in shipped_layers]  # a walk even where a quota counts
        rounds_cost = {}
        ways = [("one walk of every layer", walked), ("one Docker call for every layer", unread)]
        if any(layer.enforced for layer in shipped_layers):
            ways.append(("one statvfs of every layer (quota)", shipped_layers))
        for label, layers in ways:
            before = Parts.sample(engine, None, ids, shims)
            for _ in range(20):
                await asyncio.to_thread(watch.measure_all, layers)
            rounds_cost[label] = cost = (Parts.sample(engine, None, ids, shims) - before).scaled(1000 / 20)
            row(f"{label}: ms of CPU per round", *cost.cells("ms"))
        shipped, old = medians[SHIPPED], medians[BEFORE]
        watch_cost = rounds_cost[ways[-1][0] if len(ways) == 3 else ways[0][0]].total / count  # ran beside the poll
        print(f"  host CPU per idle sandbox: before {old.total - watch_cost:.2f} ms/s (the per-sandbox poll's row less "
              f"the shipped watch's own round), as shipped {shipped.total:.2f} ms/s")  # fmt: skip
    finally:
        await asyncio.gather(*(s.close() for s in sandboxes), return_exceptions=True)


# ----- 2. ramp ------------------------------------------------------------------------------------------------
async def step_all(envs: list[TerminusEnv], busy: int, burn_s: float, interval_s: float, window_s: float):
    """Every env steps once per ``interval_s`` at its own phase for ``window_s``: (times, busy times, errors)."""
    times: list[float] = []
    busy_times: list[float] = []
    errors: list[str] = []
    small, burning = reply("echo hi\n", 1.0), reply(f"timeout {burn_s:g} sh -c 'while :; do :; done'\n", burn_s + 2)
    start = time.monotonic()
    end = start + window_s

    async def one(index: int, env: TerminusEnv) -> None:
        due = start + random.uniform(0, interval_s)
        while due < end:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            began = time.perf_counter()
            try:
                _, _, terminated, truncated, info = await env.astep(burning if index < busy else small)
            except Exception as exc:  # noqa: BLE001 - the first failure is what the level reports
                errors.append(f"a step failed: {type(exc).__name__}: {exc}")
                return
            (busy_times if index < busy else times).append(time.perf_counter() - began)
            if terminated or truncated:
                errors.append(f"an episode ended: {info.get('end_reason')} {info.get('episode', {}).get('error')}")
                return
            due += interval_s

    await asyncio.gather(*(one(index, env) for index, env in enumerate(envs)))
    return times, busy_times, errors


async def ramp(where: str, pool: Any, engine: Engine, owner_pid: int | None, args: argparse.Namespace) -> None:
    print(f"2. Ramp {where}: each sandbox steps `echo hi` once per {args.interval:g} s, {args.busy} burn a core "
          f"{args.burn:g} s per step; {args.window:g} s per level")  # fmt: skip
    level_row("live", "starts/s", "p50", "p99", "max", "busy p50", "owner", "dockerd", "shims", "containers",
              "driver", "used GiB", "avail GiB")  # fmt: skip
    print("    (CPU in cores over the window; owner: this process locally, the host actor through Ray)")
    task = replace(find_task("hello-world"), agent_timeout_s=None)
    envs: list[TerminusEnv] = []
    per_sandbox_gib = 0.05
    used_at_start, _ = host_memory_gib()
    slow_at: int | None = None
    try:
        for level in args.levels:
            _, available = host_memory_gib()
            adding = level - len(envs)
            if available - adding * per_sandbox_gib < args.floor_gib:
                print(f"  stopped before {level}: {adding} more would leave under {args.floor_gib:g} GiB available "
                      f"({available:.1f} GiB now, {per_sandbox_gib * 1024:.0f} MB per sandbox)")  # fmt: skip
                return
            fresh = [TerminusEnv(task, mode="eval", sandbox_pool=pool) for _ in range(adding)]
            began = time.perf_counter()
            results = await at_most(START_AT_ONCE, [env.areset for env in fresh])
            start_s = time.perf_counter() - began
            failed = [r for r in results if isinstance(r, BaseException)]
            envs += [env for env, r in zip(fresh, results) if not isinstance(r, BaseException)]
            await asyncio.gather(*(env.aclose() for env, r in zip(fresh, results) if isinstance(r, BaseException)))
            ids = [env._episode.sandbox.id for env in envs]  # noqa: SLF001 - the containers to measure
            shims = shim_pids(ids)
            await asyncio.sleep(3)
            before, driver = Parts.sample(engine, owner_pid, ids, shims), time.process_time()
            times, busy_times, errors = await step_all(envs, args.busy, args.burn, args.interval, args.window)
            cpu = (Parts.sample(engine, owner_pid, ids, shims) - before).scaled(1 / args.window)
            driver_cores = (time.process_time() - driver) / args.window if owner_pid else 0.0
            used, available = host_memory_gib()
            if envs:  # over every sandbox so far: steadier than one level's difference on a shared machine
                per_sandbox_gib = max(per_sandbox_gib, (used - used_at_start) / len(envs))
            p99 = pct(times, 0.99) if times else float("inf")
            slow = f"step p99 {ms(p99)} > {ms(P99_LIMIT_S)}" if p99 > P99_LIMIT_S else None
            broke = (
                f"{len(failed)} of {adding} starts failed: {failed[0]!r}" if failed
                else errors[0] if errors
                else f"available memory {available:.1f} GiB < {args.floor_gib:g} GiB" if available < args.floor_gib
                else None if args.past_p99 else slow
            )  # fmt: skip
            level_row(str(len(envs)), f"{adding / start_s:.1f}" if adding else "", ms(pct(times, 0.5)) if times else "",
                ms(p99) if times else "", ms(max(times)) if times else "",
                ms(pct(busy_times, 0.5)) if busy_times else "", f"{cpu.owner:.3f}", f"{cpu.dockerd:.3f}",
                f"{cpu.shims:.3f}", f"{cpu.containers:.3f}", f"{driver_cores:.3f}" if owner_pid else "",
                f"{used:.1f}", f"{available:.1f}")  # fmt: skip
            print(f"    {len(times)} steps; containerd {cpu.containerd:.3f} cores; {per_sandbox_gib * 1024:.0f} MB "
                  f"of host memory per sandbox; load {os.getloadavg()[0]:.1f}")  # fmt: skip
            if slow and slow_at is None:
                slow_at = len(envs)
                if args.past_p99:
                    print(f"  {slow} at {slow_at}: going on (--past-p99)")
            if broke:
                print(f"  first thing that broke at {len(envs)}: {broke}")
                return
        print(f"  nothing broke up to {len(envs)} sandboxes (the last level asked for)")
    finally:
        await asyncio.gather(*(env.aclose() for env in envs), return_exceptions=True)


# ----- 3. burst -----------------------------------------------------------------------------------------------
async def burst(label: str, pool: Any, spec: SandboxSpec, count: int, warm: bool) -> None:
    """Time ``count`` acquires at once to all ready; with ``warm``, once the pool has its warm sandboxes."""
    if warm:
        await pool.release(await pool.acquire(spec))  # the pool learns the spec and starts its warm ones
        await pool.wait_warm()
    began = time.perf_counter()
    results = await asyncio.gather(*(pool.acquire(spec) for _ in range(count)), return_exceptions=True)
    took = time.perf_counter() - began
    held = [r for r in results if not isinstance(r, BaseException)]
    failed = [r for r in results if isinstance(r, BaseException)]
    row(label, f"{took:.1f} s", f"{len(held)}/{count} ready", f"{failed[0]!r}"[:60] if failed else "")
    await asyncio.gather(*(pool.release(sandbox) for sandbox in held))


# ----- the Ray side -------------------------------------------------------------------------------------------
@contextmanager
def ray_cluster(slots: int) -> Iterator[None]:
    """A local one-node Ray cluster offering ``slots`` sandbox slots; this process joins it as the driver."""
    import ray
    from ray.cluster_utils import Cluster

    from terminus_env.sandbox.fleet import RESOURCE

    node = {"num_cpus": 1, "resources": {RESOURCE: slots}, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args=node)
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
        cluster.shutdown()


def fleet_config(slots: int, warm: int = 0) -> Any:
    from terminus_env.sandbox.fleet import FleetConfig, HostLimits

    # This machine's cores and memory must not cap the host's slots: the point is to find where it breaks.
    limits = HostLimits(sandboxes_per_cpu=slots, memory_mb_per_sandbox=1, max_sandboxes=slots)
    return FleetConfig(limits=limits, warm_per_spec=warm, max_warm=warm)


async def main(args: argparse.Namespace) -> None:
    client = docker.from_env()
    engine = Engine.find()
    print(f"{os.cpu_count()} cores, {sum(host_memory_gib()):.1f} GiB; engine: dockerd pid {engine.dockerd}; "
          f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")  # fmt: skip
    if "idle" in args.parts:
        await idle_cost(client, engine, args.idle, args.idle_window, args.rounds)
    if "ramp" in args.parts and "local" in args.where:
        async with SandboxPool(warm_per_spec=0, client=client) as pool:
            await ramp("locally", pool, engine, None, args)
    if "burst" in args.parts and "local" in args.where:
        print(f"3. Burst locally: {args.burst} starts of one image at once, to all ready")
        async with SandboxPool(warm_per_spec=0, client=client) as pool:
            await burst("cold starts", pool, SPEC, args.burst, warm=False)
        async with SandboxPool(warm_per_spec=args.burst, client=client, max_warm=args.burst) as pool:
            await burst(f"from warm sandboxes (warm_per_spec={args.burst})", pool, SPEC, args.burst, warm=True)
    if "ray" in args.where and ("ramp" in args.parts or "burst" in args.parts):
        from terminus_env.sandbox.fleet import RaySandboxPool

        slots = max(args.levels[-1], 2 * args.burst)
        with ray_cluster(slots):
            if "ramp" in args.parts:
                async with RaySandboxPool(config=fleet_config(slots)) as pool:
                    await ramp("through one Ray host", pool, engine, pool.hosts[0].info.pid, args)
            if "burst" in args.parts:
                print(f"3. Burst through one Ray host: {args.burst} starts of one image at once, to all ready")
                async with RaySandboxPool(config=fleet_config(slots)) as pool:
                    await burst("cold starts", pool, SPEC, args.burst, warm=False)
                async with RaySandboxPool(config=fleet_config(slots, warm=args.burst)) as pool:
                    await burst(f"from warm sandboxes (warm_per_spec={args.burst})", pool, SPEC, args.burst, True)
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    client.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", type=lambda text: text.split(","), default=["idle", "ramp", "burst"])
    parser.add_argument("--where", type=lambda text: text.split(","), default=["local", "ray"])
    parser.add_argument("--idle", type=int, default=32, help="sandboxes in part 1")
    parser.add_argument("--idle-window", type=float, default=20.0, help="seconds per window in part 1")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of part 1's windows")
    parser.add_argument("--levels", type=lambda text: [int(x) for x in text.split(",")],
                        default=[25, 50, 100, 150, 200, 250, 300])  # fmt: skip
    parser.add_argument("--window", type=float, default=60.0, help="seconds of stepping per level")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between one sandbox's steps")
    parser.add_argument("--busy", type=int, default=2, help="sandboxes whose steps burn a core")
    parser.add_argument("--burn", type=float, default=3.0, help="seconds each busy step burns")
    parser.add_argument("--past-p99", action="store_true", help="climb on after step p99 passes 50 ms")
    parser.add_argument("--floor-gib", type=float, default=4.0, help="stop before available memory falls under this")
    parser.add_argument("--burst", type=int, default=64, help="starts at once in part 3")
    asyncio.run(main(parser.parse_args()))
