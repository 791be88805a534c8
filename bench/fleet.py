"""Sandboxes on a Ray cluster, side by side with local sandboxes measured in the same run.

Usage: .venv/bin/python bench/fleet.py [--slots 16] [--concurrency 4] [--steps 60] [--window 10]

A local Ray cluster on this machine: first the head alone, then a second node; each offers ``--slots`` slots.
Both nodes share this machine's cores and Docker engine, so a second node adds slots, not hardware. Parts run in
the order 1, 2, 5, 3, 4 (part 4 kills the second node).

1. Placement: one decision among 64 hosts (pure function, no Ray).
2. Latency: a tmux operation and a whole `echo hi` step (TerminusEnv.astep), locally and through a host actor,
   with the bare actor round trip and the driver's CPU per remote operation.
3. Throughput: the same batch of oracle episodes locally and through the pool, with one node and with two.
4. Faults: how long a dead host's episode takes to end: its worker SIGKILLed, its worker frozen (the liveness
   check), its node killed.
5. Density: what ``--slots`` sandboxes cost one host, idle and stepping (containers, host actor, shims).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable

import docker
import ray
from host import cpu_s, rss_mb, shim_pids
from ray.cluster_utils import Cluster
from timing import pct, timed

from terminus_env.env import TerminusEnv
from terminus_env.rollout import RolloutRunner
from terminus_env.rollout.policy import OraclePolicy
from terminus_env.sandbox import SandboxLost, SandboxPool
from terminus_env.sandbox.fleet import RESOURCE, FleetConfig, HostLimits, HostLoad, RaySandboxPool, place
from terminus_env.tasks import load_tasks, shipped_tasks_dir

STEP = (
    "<response><analysis>a</analysis><plan>p</plan>"
    '<commands><keystrokes duration="1.0">echo hi\n</keystrokes></commands></response>'
)
BATCH_TASKS = ["hello-world", "ipv4-regex", "find-large-files", "fix-permissions"]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def row(label: str, *cells: str) -> None:
    print(f"  {label:<50}" + "  ".join(f"{cell:>20}" for cell in cells), flush=True)


# ----- 1. placement -------------------------------------------------------------------------------------------
def placement(hosts: int = 64, decisions: int = 20_000) -> None:
    print(f"1. Placement: one decision among {hosts} hosts (p50, p99)")
    rng = random.Random(7)
    images = [f"task-{i}" for i in range(200)]
    loads = [HostLoad(64, used=rng.randrange(64), images=set(rng.sample(images, 40))) for _ in range(hosts)]
    times = []
    for _ in range(decisions):
        image = rng.choice(images)
        started = time.perf_counter()
        index = place(loads, image)
        times.append(time.perf_counter() - started)
        if index is not None:  # keep the state moving: take a slot, free a random one
            loads[index].used += 1
            other = rng.choice(loads)
            other.used = max(0, other.used - 1)
    row("placement decision", f"{pct(times, 0.5) * 1e6:.1f} us", f"{pct(times, 0.99) * 1e6:.1f} us", "target <= 100 us")


# ----- 2. latency ---------------------------------------------------------------------------------------------
async def env_latency(env: TerminusEnv, steps: int) -> tuple[list[float], list[float], float]:
    """(tmux op times, whole step times, driver CPU seconds per tmux op)."""
    await env.areset()
    sandbox = env._episode.sandbox  # noqa: SLF001 - the bench times the env's own sandbox
    await timed(sandbox.terminal.screen, 10)  # warm
    cpu = time.process_time()
    ops = await timed(sandbox.terminal.screen, steps * 3)
    cpu = (time.process_time() - cpu) / (steps * 3)
    step_times = await timed(lambda: env.astep(STEP), steps)
    await env.aclose()
    return ops, step_times, cpu


async def latency(pool: RaySandboxPool, task, steps: int) -> None:
    print(f"2. Latency ({steps * 3} tmux operations, {steps} steps)        local (p50 / p99)   through a host actor")
    local_ops, local_steps, local_cpu = await env_latency(TerminusEnv(task, mode="eval"), steps)
    remote_ops, remote_steps, remote_cpu = await env_latency(TerminusEnv(task, mode="eval", sandbox_pool=pool), steps)
    link = pool.hosts[0]
    bare = await timed(lambda: link.call("ping", 10), steps * 3)

    def both(values: list[float]) -> str:
        return f"{ms(pct(values, 0.5))} / {ms(pct(values, 0.99))}"

    row("bare actor round trip (ping)", "", both(bare))
    row("one tmux operation (capture-pane)", both(local_ops), both(remote_ops))
    row("whole `echo hi` step (env.astep, duration 1)", both(local_steps), both(remote_steps))
    row("driver CPU per tmux operation", ms(local_cpu), ms(remote_cpu))
    calls, rate, cpu = await concurrent_pings(link, workers=32, each=20)
    row(f"{calls} pings, 32 in flight", "", f"{rate:.0f} calls/s, {ms(cpu)} CPU each")


async def concurrent_pings(link, workers: int, each: int) -> tuple[int, float, float]:
    """(calls, calls per second, driver CPU per call) with ``workers`` calls in flight at once."""

    async def worker() -> None:
        for _ in range(each):
            await link.call("ping", 30)

    cpu, started = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    calls = workers * each
    return calls, calls / (time.perf_counter() - started), (time.process_time() - cpu) / calls


# ----- 3. throughput ------------------------------------------------------------------------------------------
async def batch(pool, tasks, episodes: int, concurrency: int) -> tuple[float, int]:
    runner = RolloutRunner(OraclePolicy(command_duration=30), sandbox_pool=pool, max_sandboxes=concurrency)
    started = time.perf_counter()
    trajectories = await runner.run(tasks, group_size=episodes // len(tasks))
    elapsed = time.perf_counter() - started
    return len(trajectories) / elapsed, sum(t.reward >= 1.0 for t in trajectories)


def throughput_row(label: str, result: tuple[float, int], episodes: int) -> None:
    rate, solved = result
    row(label, f"{rate:.2f} episodes/s", f"{solved}/{episodes} solved")


# ----- 4. faults ----------------------------------------------------------------------------------------------
async def time_to_loss(pool: RaySandboxPool, spec, harm: Callable[[int], None]) -> tuple[float, int]:
    """Seconds from ``harm(host pid)`` to the SandboxLost of a command in flight on that host, and the pid."""
    sandbox = await pool.acquire(spec)
    pending = asyncio.ensure_future(sandbox.terminal.send("sleep 50\n", 55))
    await asyncio.sleep(1)
    harm(sandbox.host.info.pid)
    started = time.perf_counter()
    try:
        await pending
        raise AssertionError("the command finished on a dead host")
    except SandboxLost:
        lost = time.perf_counter() - started
    await pool.release(sandbox)
    return lost, sandbox.host.info.pid


def freeze(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)


def containers_of(pid: int) -> int:
    client = docker.from_env()
    try:
        labels = ["terminus-env.sandbox", f"terminus-env.owner-pid={pid}"]
        return len(client.api.containers(all=True, filters={"label": labels}))
    finally:
        client.close()


async def wait_gone(pid: int, limit_s: float = 60) -> float:
    started = time.perf_counter()
    while containers_of(pid) and time.perf_counter() - started < limit_s:
        await asyncio.sleep(0.2)
    return time.perf_counter() - started


# ----- 5. density ---------------------------------------------------------------------------------------------
def container_cpu_and_memory(client: docker.DockerClient, container_ids: list[str]) -> tuple[float, float]:
    """(CPU seconds so far, memory MB without page cache), summed over the containers."""
    cpu = memory = 0.0
    for cid in container_ids:
        stats = client.api.stats(cid, stream=False)
        cpu += stats["cpu_stats"]["cpu_usage"]["total_usage"] / 1e9
        mem = stats.get("memory_stats") or {}
        cache = (mem.get("stats") or {}).get("total_inactive_file", (mem.get("stats") or {}).get("cache", 0))
        memory += (mem.get("usage", 0) - cache) / 2**20
    return cpu, memory


async def density(pool: RaySandboxPool, spec, count: int, window_s: float) -> None:
    print(f"5. Density: {count} sandboxes on one host, {window_s:g} s windows")
    client = docker.from_env()
    host = pool.hosts[0]
    pid = host.info.pid
    rss_before = rss_mb(pid)
    empty = cpu_s(pid)
    await asyncio.sleep(window_s)
    empty = (cpu_s(pid) - empty) / window_s
    held = [await pool.acquire(spec) for _ in range(count)]  # one node so far: all on its host
    ids = [sandbox.id for sandbox in held if sandbox.host is host]
    held_here = [sandbox for sandbox in held if sandbox.host is host]
    shims = shim_pids(ids)
    await asyncio.sleep(3)

    def sample() -> tuple[float, float, float, float]:
        cpu, memory = container_cpu_and_memory(client, ids)
        return cpu, memory, cpu_s(pid), sum(cpu_s(s) for s in shims)

    idle0 = await asyncio.to_thread(sample)
    await asyncio.sleep(window_s)
    idle1 = await asyncio.to_thread(sample)
    steps = 0
    deadline = time.monotonic() + window_s

    async def stepper(sandbox) -> None:
        nonlocal steps
        while time.monotonic() < deadline:
            await sandbox.terminal.send("echo hi\n", 1.0)
            await sandbox.terminal.capture_new()
            steps += 1

    await asyncio.gather(*(stepper(sandbox) for sandbox in held_here))
    busy1 = await asyncio.to_thread(sample)
    n = len(ids)
    shim_rss = sum(rss_mb(s) for s in shims)
    row("sandboxes on the host", str(n), f"{len(shims)} shims found")
    row("memory per sandbox (container, no page cache)", f"{idle1[1] / n:.1f} MB")
    row("memory per sandbox (containerd shim)", f"{shim_rss / max(len(shims), 1):.1f} MB")
    row("host actor memory per sandbox", f"{(rss_mb(pid) - rss_before) / n:.1f} MB", f"{rss_mb(pid):.0f} MB in all")
    idle = [(b - a) / window_s for a, b in zip(idle0, idle1)]
    row("idle CPU, cores: containers / host actor / shims", f"{idle[0]:.3f} / {idle[2]:.3f} / {idle[3]:.3f}")
    row("host actor CPU with no sandbox, cores", f"{empty:.3f}")
    busy_cores = [(b - a) / window_s for a, b in zip(idle1, busy1)]
    rate = steps / window_s
    row("stepping: steps/s", f"{rate:.1f}", f"{n} sandboxes back to back")
    row("stepping CPU, cores: containers / host actor", f"{busy_cores[0]:.3f} / {busy_cores[2]:.3f}")
    row("CPU per step, ms: containers + host actor", f"{(busy_cores[0] + busy_cores[2]) / rate * 1000:.2f}")
    for sandbox in held:
        await pool.release(sandbox)
    client.close()


async def on_node(pool: RaySandboxPool, specs: list, node_id: str):
    """A sandbox on the given node's host: two specs no host has the image of go to two empty hosts."""
    pair = [await pool.acquire(spec) for spec in specs]
    chosen = next(sandbox for sandbox in pair if sandbox.host.info.node_id == node_id)
    for sandbox in pair:
        if sandbox is not chosen:
            await pool.release(sandbox)
    return chosen


async def main(args: argparse.Namespace) -> None:
    placement()
    tasks = load_tasks(shipped_tasks_dir(), BATCH_TASKS)
    hello = tasks[0]
    per_node = args.concurrency
    episodes = 4 * per_node
    node_args = {"num_cpus": 1, "resources": {RESOURCE: args.slots}}
    cluster = Cluster(initialize_head=True, head_node_args={**node_args, "include_dashboard": False})
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        # The bench fills one host (part 5): its slots must not be capped by this machine's 2 cores.
        async with RaySandboxPool(config=FleetConfig(limits=HostLimits(sandboxes_per_cpu=args.slots))) as pool:
            await latency(pool, hello, args.steps)
            spec = hello.sandbox_spec(await pool.build_image(hello.build_context, hello.name, 600))
            await density(pool, spec, args.slots, args.window)
            print(f"3. Throughput: {episodes} oracle episodes of {len(tasks)} shipped tasks")
            local = SandboxPool(warm_per_spec=0)
            throughput_row(f"local, {per_node} at once", await batch(local, tasks, episodes, per_node), episodes)
            throughput_row(f"1 node, {per_node} at once", await batch(pool, tasks, episodes, per_node), episodes)
            second = cluster.add_node(**node_args)
            await pool.refresh()
            both = 2 * per_node
            throughput_row(f"local, {both} at once", await batch(local, tasks, episodes, both), episodes)
            throughput_row(f"2 nodes, {both} at once", await batch(pool, tasks, episodes, both), episodes)
            await local.aclose()
        config = FleetConfig()  # the defaults: a check every 2 s, 10 s to answer
        print(f"4. Faults: from the harm to the in-flight command's SandboxLost (bound {config.loss_bound_s:g} s)")
        async with RaySandboxPool(config=config) as pool:
            spec = hello.sandbox_spec(await pool.build_image(hello.build_context, hello.name, 600))
            lost, pid = await time_to_loss(pool, spec, lambda pid: os.kill(pid, signal.SIGKILL))
            row("host worker SIGKILLed", f"{lost:.2f} s", f"containers gone {await wait_gone(pid):.1f} s later")
            await pool.refresh()
            lost, pid = await time_to_loss(pool, spec, freeze)
            os.kill(pid, signal.SIGCONT)  # the pool's kill lands once it runs again
            row("host worker frozen (SIGSTOP)", f"{lost:.2f} s", f"containers gone {await wait_gone(pid):.1f} s later")
            await pool.refresh()
            other = tasks[1].sandbox_spec(await pool.build_image(tasks[1].build_context, tasks[1].name, 600))
            sandbox = await on_node(pool, [spec, other], second.node_id)
            victim = sandbox.host.info.pid
            pending = asyncio.ensure_future(sandbox.terminal.send("sleep 50\n", 55))
            await asyncio.sleep(1)
            cluster.remove_node(second, allow_graceful=False)
            started = time.perf_counter()
            try:
                await pending
            except SandboxLost:
                pass
            row("node killed (raylet and all)", f"{time.perf_counter() - started:.2f} s",
                f"containers gone {await wait_gone(victim):.1f} s later")  # fmt: skip
            await pool.release(sandbox)
    finally:
        ray.shutdown()
        cluster.shutdown()
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slots", type=int, default=16, help="terminus_sandbox_host slots per node (part 5 fills one)")
    parser.add_argument("--concurrency", type=int, default=4, help="episodes at once per node in part 3")
    parser.add_argument("--steps", type=int, default=60, help="echo-hi steps per latency measurement")
    parser.add_argument("--window", type=float, default=10.0, help="seconds per density window")
    print(f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip() + " cores")
    asyncio.run(main(parser.parse_args()))
