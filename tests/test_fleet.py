"""Sandboxes on a Ray cluster: placement rules, the wire format, and real episodes on a local two-node cluster.

The cluster's two nodes run on this one machine and share its Docker engine (see fleet_support.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import docker
import pytest
from fleet_support import SLOTS, TwoNodes, import_ray, two_nodes
from sandbox_support import Runner, containers_of_pid, run_fixture  # noqa: F401

from terminus_env.env import EndReason, TerminusEnv
from terminus_env.rollout import RolloutRunner
from terminus_env.rollout.policy import OraclePolicy, PolicyOutput, Rollout
from terminus_env.rules import Reply
from terminus_env.sandbox import errors
from terminus_env.sandbox.errors import (
    AgentCaused,
    BrokenByAgent,
    DiskLimitExceeded,
    ImageBuildError,
    SandboxError,
    SandboxLost,
    error_kinds,
)
from terminus_env.tasks import load_task, load_tasks, shipped_tasks_dir

ray = import_ray()

from terminus_env.sandbox.fleet import (  # noqa: E402 - after the check that Ray is there
    FleetConfig,
    HostLimits,
    HostLoad,
    RaySandboxPool,
    host_slots,
    place,
)
from terminus_env.sandbox.fleet.wire import WireError, error_from_wire, error_to_wire  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
QUICK = FleetConfig(ping_interval_s=0.5, ping_timeout_s=5.0, refresh_s=600.0, slot_wait_s=3.0)
"""Never looks for new nodes by itself (the tests call refresh()), and gives up on a full cluster after 3 s."""


# ----- placement and the wire format: pure rules -------------------------------------------------------------


def test_slots_are_the_smallest_of_offer_cores_memory_and_limit() -> None:
    limits = HostLimits(sandboxes_per_cpu=4, memory_mb_per_sandbox=512, max_sandboxes=100)
    assert host_slots(offered=16, cpus=8, memory_mb=64_000, limits=limits) == 16  # the offer
    assert host_slots(offered=64, cpus=8, memory_mb=64_000, limits=limits) == 32  # the cores
    assert host_slots(offered=64, cpus=64, memory_mb=10_000, limits=limits) == 19  # the memory
    assert host_slots(offered=500, cpus=64, memory_mb=1e6, limits=limits) == 100  # the limit
    assert host_slots(offered=0.5, cpus=8, memory_mb=64_000, limits=limits) == 0
    with pytest.raises(ValueError, match="max_sandboxes"):
        HostLimits(max_sandboxes=0)


def test_placement_prefers_the_image_then_spreads_and_needs_a_free_slot() -> None:
    hosts = [HostLoad(4, used=3, images={"a"}), HostLoad(4, used=1), HostLoad(4, used=0), HostLoad(2, used=1)]
    assert place(hosts, "a") == 0  # the image wins over a lighter load
    assert place(hosts, "b") == 2  # nobody has it: the least loaded
    hosts[0].used = 4
    assert place(hosts, "a") == 2  # the image's host is full
    hosts[2].used = 2
    assert place(hosts, "b") == 1  # 1/4 in use beats 2/4 and 1/2
    assert place([HostLoad(2, used=2), HostLoad(0)], "a") is None
    assert place([], "a") is None


def test_errors_cross_the_wire_with_their_type_and_fields() -> None:
    disk = error_from_wire(error_to_wire(DiskLimitExceeded(120.5, 100)))
    assert isinstance(disk, DiskLimitExceeded) and (disk.used_mb, disk.limit_mb) == (120.5, 100)
    assert "the task's storage limit is 100 MB" in str(disk)
    unmeasured = error_from_wire(error_to_wire(DiskLimitExceeded(None, 100, "Docker reported its size as -1")))
    assert isinstance(unmeasured, DiskLimitExceeded) and unmeasured.used_mb is None
    assert unmeasured.unmeasured == "Docker reported its size as -1" and "could not be measured" in str(unmeasured)
    build = error_from_wire(error_to_wire(ImageBuildError("t", "exit 3", "last line")))
    assert isinstance(build, ImageBuildError) and build.log_tail == "last line" and "exit 3" in str(build)
    other = error_from_wire(error_to_wire(KeyError("x")))
    assert type(other) is SandboxError and "KeyError" in str(other)
    assert type(error_from_wire(WireError("NoSuchError", "m"))) is SandboxError


def test_every_sandbox_error_crosses_the_wire_with_its_fault() -> None:
    """A class the wire did not know crossed as the infrastructure's plain error: an agent that broke the verifier's
    shell on a remote host had its 0 masked. Every class is known now, found from the base class."""
    kinds = error_kinds()
    assert {"BrokenByAgent", "TerminalGone", "ResourcesExhausted", "DiskLimitExceeded", "SandboxLost"} <= set(kinds)
    for cls in kinds.values():
        sent = cls.__new__(cls)
        Exception.__init__(sent, "what happened")
        back = error_from_wire(error_to_wire(sent))
        assert type(back) is cls and str(back) == "what happened"
        assert isinstance(back, AgentCaused) == issubclass(cls, AgentCaused)

    class Wrecked(BrokenByAgent):  # a class the host has loaded and the pool's side may not have
        def __init__(self, what: str) -> None:
            super().__init__(f"the agent removed {what}")

    wire = error_to_wire(Wrecked("/bin/sh"))
    assert isinstance(error_from_wire(wire), Wrecked)
    unknown = dataclasses.replace(wire, kind="ClassThePoolNeverLoaded")
    back = error_from_wire(unknown)
    assert type(back) is BrokenByAgent and str(back) == "ClassThePoolNeverLoaded: the agent removed /bin/sh"


def test_a_stray_class_named_like_ours_never_takes_its_place_on_the_wire() -> None:
    """The disguise of the same channel: a class defined elsewhere under the name of an agent's error, deriving from
    the infrastructure's base, must not make the agent's error cross as the infrastructure's."""

    class TerminalGone(SandboxError):
        pass

    assert error_kinds()["TerminalGone"] is not TerminalGone
    back = error_from_wire(error_to_wire(errors.TerminalGone("the shell exited")))
    assert isinstance(back, AgentCaused) and type(back) is errors.TerminalGone


# ----- a real two-node cluster -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nodes(docker_required: None) -> Iterator[TwoNodes]:
    yield from two_nodes(ray)


@contextlib.asynccontextmanager
async def pool_of(config: FleetConfig = QUICK) -> AsyncIterator[RaySandboxPool]:
    async with RaySandboxPool(config=config) as pool:
        yield pool


def reply(keystrokes: str, duration: float, complete: bool = False) -> str:
    done = "<task_complete>true</task_complete>" if complete else ""
    return (
        "<response><analysis>a</analysis><plan>p</plan>"
        f'<commands><keystrokes duration="{duration}">{keystrokes}</keystrokes></commands>{done}</response>'
    )


class SlowPolicy:
    """Solves the tiny task, then keeps its terminal busy for ``busy_s``, so a host can die mid-episode."""

    def __init__(self, busy_s: int) -> None:
        self.busy_s = busy_s

    @contextlib.asynccontextmanager
    async def session(self, rollout: Rollout) -> AsyncIterator[None]:
        yield

    async def act(self, rollout: Rollout, messages: list[dict[str, str]]) -> PolicyOutput:
        if sum(m["role"] == "assistant" for m in messages) == 0:
            text = reply(f"echo hello > /app/hello.txt; sleep {self.busy_s}\n", self.busy_s + 10)
        else:
            text = reply("", 1, complete=True)
        return PolicyOutput(Reply(text))


def host_pids(pool: RaySandboxPool) -> list[int]:
    return [info.pid for info, _, _ in pool.describe()]


async def wait_until(check, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout_s:g} s")
        await asyncio.sleep(0.1)


def busy_containers(pids: list[int], command: str) -> int:
    """Containers of these owners (host actors' pids) that run ``command`` now, as ``docker top`` lists them."""
    client = docker.from_env()
    try:
        busy = 0
        for container_id in (c for pid in pids for c in containers_of_pid(pid)):
            try:
                rows = client.api.top(container_id)["Processes"] or []
            except docker.errors.APIError:  # gone meanwhile
                continue
            busy += any(command in " ".join(map(str, row)) for row in rows)
        return busy
    finally:
        client.close()


async def wait_until_busy(pool: RaySandboxPool, policy: SlowPolicy, episodes: int) -> None:
    """Every episode's first command is running in its container (typed, not only sent by the policy)."""
    command = f"sleep {policy.busy_s}"
    deadline = time.monotonic() + 120
    while await asyncio.to_thread(busy_containers, host_pids(pool), command) < episodes:
        assert time.monotonic() < deadline, f"{episodes} episodes running {command!r}: not within 120 s"
        await asyncio.sleep(0.2)


def wait_for_no_containers(pids: list[int], timeout_s: float) -> list[str]:
    deadline = time.monotonic() + timeout_s
    left = [c for pid in pids for c in containers_of_pid(pid)]
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = [c for pid in pids for c in containers_of_pid(pid)]
    return left


def test_shipped_tasks_through_the_env_and_the_runner(nodes: TwoNodes, run: Runner) -> None:
    tasks = load_tasks(shipped_tasks_dir(), ["hello-world", "ipv4-regex", "find-large-files", "fix-permissions"])

    async def scenario() -> tuple[list, str, list[int]]:
        async with pool_of() as pool:
            assert len(pool.hosts) == 2 and all(link.load.slots == SLOTS for link in pool.hosts)
            env = TerminusEnv(tasks[0], sandbox_pool=pool)
            try:
                await env.areset()
                obs, _, terminated, _, _ = await env.astep(reply("echo fleet-$((6*7))\n", 5))
                assert not terminated
            finally:
                await env.aclose()
            runner = RolloutRunner(OraclePolicy(command_duration=30), sandbox_pool=pool, max_sandboxes=2 * SLOTS)
            trajectories = await runner.run(tasks)
            await wait_until(lambda: sum(link.load.used for link in pool.hosts) == 0, 60, "slots freed after release")
            return trajectories, obs, host_pids(pool)

    trajectories, obs, pids = run(scenario())
    assert "fleet-42" in obs
    assert [(t.task, t.reward, t.error) for t in trajectories] == [(t.name, 1.0, None) for t in tasks]
    assert all(t.summary.end_reason is EndReason.TASK_COMPLETE for t in trajectories)
    assert wait_for_no_containers(pids, 30) == []


def test_placement_follows_slots_and_image_locality(nodes: TwoNodes, run: Runner, tmp_path: Path) -> None:
    first, second = (_fresh_task(tmp_path / name) for name in ("fleet-one", "fleet-two"))

    async def scenario() -> tuple[list[int], list[int], str, list[str]]:
        async with pool_of() as pool:
            hosts = {link.info.pid: index for index, link in enumerate(pool.hosts)}
            spec_one = first.sandbox_spec(await pool.build_image(first.build_context, first.name, 300))
            spec_two = second.sandbox_spec(await pool.build_image(second.build_context, second.name, 300))
            assert spec_one.image.startswith("build-context://fleet-one/")
            held = [await pool.acquire(spec_one)]  # built on its host, from the context in the object store
            held.append(await pool.acquire(spec_one))  # the host with the image, though the other is empty
            placed = [hosts[s.host.info.pid] for s in held]
            held.append(await pool.acquire(spec_two))  # the first host is full: the other
            held.append(await pool.acquire(spec_one))
            placed += [hosts[s.host.info.pid] for s in held[2:]]
            with pytest.raises(SandboxError, match="no sandbox slot came free within 3 s"):
                await pool.acquire(spec_two)
            await pool.release(held.pop())
            held.append(await pool.acquire(spec_two))  # the freed slot
            used = [link.load.used for link in pool.hosts]
            listing = await held[0].exec("cat /built", 30)
            images = [held[0].image, held[2].image]
            for sandbox in held:
                await pool.release(sandbox)
            return placed, used, listing.output, images

    placed, used, built, images = run(scenario())
    for image in images:
        _remove_image(image)
    assert placed[0] == placed[1] and placed[2] == placed[3] != placed[0]
    assert used == [SLOTS, SLOTS]
    assert built.strip() == "fleet-one" and images[0].startswith("terminus-env/task-fleet-one:")


def test_hosts_keep_warm_sandboxes_so_a_start_is_a_take(nodes: TwoNodes, run: Runner, tiny_task_dir: Path) -> None:
    task = load_task(tiny_task_dir)

    async def scenario() -> tuple[int, bool, str, int, list[int]]:
        async with pool_of(dataclasses.replace(QUICK, warm_per_spec=1)) as pool:
            spec = task.sandbox_spec(await pool.build_image(task.build_context, task.name, 300))
            first = await pool.acquire(spec)  # a cold start; its host then starts one warm for the spec
            warm = await pool.wait_warm()
            existing = set(containers_of_pid(first.host.info.pid))
            second = await pool.acquire(spec)  # the host with the image, and a warm sandbox of the spec
            await second.terminal.send("echo from-warm\n", 5)
            text = (await second.terminal.capture_new()).text
            refilled = await pool.wait_warm()
            pids = host_pids(pool)
            for sandbox in (first, second):
                await pool.release(sandbox)
            return warm, second.id in existing, text, refilled, pids

    warm, taken, text, refilled, pids = run(scenario())
    assert warm == 1 and taken, "the second sandbox was started before it was asked for"
    assert "from-warm" in text and refilled == 1
    assert wait_for_no_containers(pids, 30) == [], "the pool's close removes the warm sandboxes too"


def test_a_killed_host_ends_only_its_episodes_as_env_error(nodes: TwoNodes, run: Runner, tiny_task_dir: Path) -> None:
    task = load_task(tiny_task_dir)

    async def scenario() -> tuple[list, float, list[str], int, list]:
        async with pool_of() as pool:
            finished: list[float] = []
            policy = SlowPolicy(busy_s=12)
            stamp = lambda _: finished.append(time.monotonic())  # noqa: E731
            runner = RolloutRunner(policy, sandbox_pool=pool, max_sandboxes=2 * SLOTS, on_finish=stamp)
            batch = asyncio.ensure_future(runner.run([task], group_size=2 * SLOTS))
            await wait_until_busy(pool, policy, 2 * SLOTS)
            victim = pool.hosts[0].info.pid
            os.kill(victim, signal.SIGKILL)
            killed = time.monotonic()
            trajectories = await batch
            errors_within = max(finished[:SLOTS]) - killed
            # The daemons stop the dead worker's containers themselves: no reaper has run (no new host yet).
            left = await asyncio.to_thread(wait_for_no_containers, [victim], 30)
            await pool.refresh()  # the node offers its slots again: a new host takes them
            again = await runner.run([task], group_size=2 * SLOTS)
            return trajectories, errors_within, left, len(pool.hosts), again

    trajectories, errors_within, left, hosts, again = run(scenario())
    ended = sorted((t.summary.end_reason, t.reward) for t in trajectories)
    assert ended == [(EndReason.ENV_ERROR, 0.0)] * SLOTS + [(EndReason.TASK_COMPLETE, 1.0)] * SLOTS
    lost = [t.summary for t in trajectories if t.summary.masked]
    assert all("SandboxLost" in s.error and "is gone" in s.error for s in lost)
    assert errors_within < 30, f"the dead host's episodes ended {errors_within:.1f} s after the kill"
    assert left == []
    assert hosts == 2 and [t.reward for t in again] == [1.0] * (2 * SLOTS)


def test_a_dead_node_ends_its_episodes_and_a_new_node_takes_sandboxes(
    nodes: TwoNodes, run: Runner, tiny_task_dir: Path
) -> None:
    task = load_task(tiny_task_dir)
    pool = RaySandboxPool(config=FleetConfig(ping_interval_s=0.5, ping_timeout_s=5.0, refresh_s=1.0, slot_wait_s=60))

    async def batch_while_the_node_dies() -> tuple[list, float, list[int]]:
        finished: list[float] = []
        policy = SlowPolicy(busy_s=12)
        stamp = lambda _: finished.append(time.monotonic())  # noqa: E731
        runner = RolloutRunner(policy, sandbox_pool=pool, max_sandboxes=2 * SLOTS, on_finish=stamp)
        batch = asyncio.ensure_future(runner.run([task], group_size=2 * SLOTS))
        await wait_until_busy(pool, policy, 2 * SLOTS)
        doomed = [link.info.pid for link in pool.hosts if link.info.node_id == nodes.worker.node_id]
        nodes.kill_worker()
        killed = time.monotonic()
        trajectories = await batch
        return trajectories, max(finished[:SLOTS]) - killed, doomed

    async def fill_the_cluster() -> list[int]:
        await wait_until(lambda: len(pool.hosts) == 2, 120, "a host on the new node")
        spec = task.sandbox_spec(await pool.build_image(task.build_context, task.name, 300))
        held = [await pool.acquire(spec) for _ in range(2 * SLOTS)]
        used = [link.load.used for link in pool.hosts]
        for sandbox in held:
            await pool.release(sandbox)
        return used

    run(pool.start())
    try:
        trajectories, errors_within, doomed = run(batch_while_the_node_dies())
        nodes.add_worker()  # on the main thread, as Ray wants: the pool's loop waits meanwhile
        used = run(fill_the_cluster())
    finally:
        run(pool.aclose())
    ended = sorted((t.summary.end_reason, t.reward) for t in trajectories)
    assert ended == [(EndReason.ENV_ERROR, 0.0)] * SLOTS + [(EndReason.TASK_COMPLETE, 1.0)] * SLOTS
    assert errors_within < 30, f"the dead node's episodes ended {errors_within:.1f} s after the kill"
    assert used == [SLOTS, SLOTS]  # the new node's host holds its share
    assert wait_for_no_containers(doomed, 30) == []


def test_eval_command_runs_on_the_cluster(nodes: TwoNodes, tmp_path: Path) -> None:
    command = [
        sys.executable, "-m", "terminus_env.cli", "eval", "--oracle", "--ray", nodes.cluster.address,
        "--name", "hello-world", "--name", "ipv4-regex", "--concurrency", "4",
        "--run-file", str(tmp_path / "run.jsonl"), "--jobs-dir", str(tmp_path / "jobs"),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr  # the oracle exits 1 unless every task is solved
    assert "2 rollouts · 0 invalid" in result.stdout, result.stdout


def test_a_lost_host_answers_like_a_vanished_container(nodes: TwoNodes, run: Runner, tiny_task_dir: Path) -> None:
    """After its host died, a sandbox says the loss was not the agent's doing, so the env masks the episode."""
    task = load_task(tiny_task_dir)

    async def scenario() -> tuple[bool, bool, str]:
        async with pool_of() as pool:
            spec = task.sandbox_spec(await pool.build_image(task.build_context, task.name, 300))
            sandbox = await pool.acquire(spec)
            assert sandbox.alive
            os.kill(sandbox.host.info.pid, signal.SIGKILL)
            with pytest.raises(SandboxLost, match="is gone"):
                await sandbox.terminal.send("echo hi\n", 5)
            agents, alive = await sandbox.lost_to_agent(), sandbox.alive
            await pool.release(sandbox)
            await pool.refresh()
            return agents, alive, sandbox.daemon_stderr

    assert run(scenario()) == (False, False, "")


def test_a_cluster_without_sandbox_nodes_is_a_clear_error(
    nodes: TwoNodes, run: Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No node offers the resource (here: the listing shows none): the error says how to offer slots."""
    monkeypatch.setattr(ray, "nodes", lambda: [{"NodeID": "ab" * 28, "Alive": True, "Resources": {"CPU": 8.0}}])

    async def scenario() -> None:
        pool = RaySandboxPool(config=QUICK)
        try:
            await pool.start()
        finally:
            await pool.aclose()

    with pytest.raises(SandboxError, match=r"no live node offers the resource 'terminus_sandbox_host'.*ray start"):
        run(scenario())


def _fresh_task(folder: Path):
    """A tiny task whose image no host has yet (its Dockerfile is unique to this run)."""
    (folder / "environment").mkdir(parents=True)
    (folder / "tests").mkdir()
    (folder / "task.toml").write_text('version = "1.0"\n[environment]\ncpus = 1\nmemory_mb = 256\n')
    (folder / "instruction.md").write_text("Nothing to do.\n")
    (folder / "environment" / "Dockerfile").write_text(
        f"FROM terminus-env/base:bookworm\nRUN echo {folder.name} > /built && echo {time.time_ns()} > /stamp\n"
    )
    (folder / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    return load_task(folder)


def _remove_image(tag: str) -> None:
    import docker

    client = docker.from_env()
    try:
        client.images.remove(tag, force=True)
    finally:
        client.close()


def test_a_host_that_stops_answering_is_lost_by_the_liveness_check(
    nodes: TwoNodes, run: Runner, tiny_task_dir: Path
) -> None:
    """A frozen host (SIGSTOP: what a node cut off the network looks like) is still alive to Ray; the pool's own
    check declares it lost, its sandbox's call fails, and the host is killed with its containers."""
    task = load_task(tiny_task_dir)

    async def scenario() -> tuple[float, int, list[str]]:
        async with pool_of() as pool:
            spec = task.sandbox_spec(await pool.build_image(task.build_context, task.name, 300))
            sandbox = await pool.acquire(spec)
            pid = sandbox.host.info.pid
            os.kill(pid, signal.SIGSTOP)
            stopped = time.monotonic()
            try:
                with pytest.raises(SandboxLost, match="liveness check"):
                    await sandbox.terminal.send("sleep 30\n", 40)
                lost_after = time.monotonic() - stopped
            finally:
                os.kill(pid, signal.SIGCONT)  # the kill the pool sent can land now, whatever it was
            left = await asyncio.to_thread(wait_for_no_containers, [pid], 30)
            await pool.release(sandbox)
            await pool.refresh()
            return lost_after, len(pool.hosts), left

    lost_after, hosts, left = run(scenario())
    assert lost_after < 30, f"lost after {lost_after:.1f} s"
    assert hosts == 2 and left == []
