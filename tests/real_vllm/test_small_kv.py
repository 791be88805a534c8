"""The small fleet's tiny KV cache (``SMALL_KV_BLOCKS`` blocks of 32 tokens a replica): vLLM preempts when requests
outgrow it, and the pool fails over when one replica is killed between turns while the other serves on."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from vllm_support import MODEL_NAME, SMALL_KV_BLOCKS, TEST_TIMEOUT_S

from terminus_env.serving import ReplicaClient, ServingPool

# A fleet's start and a restarted replica's return may come before a test's own work (vllm_support).
pytestmark = pytest.mark.timeout(TEST_TIMEOUT_S)
# Each request needs 29 blocks by its end, and 8 of them near five times what a replica holds: however a busy host
# spreads their arrival (it took seconds on a loaded 2-core machine), they run together long enough to outgrow it.
REQUESTS, OUTPUT = 8, 900


def test_requests_outgrowing_a_small_kv_cache_are_preempted_and_still_finish(small_fleet):
    url = small_fleet.urls[0]

    async def main():
        async with ReplicaClient(url) as client:
            before = (await client.metrics())["0"]
            chats = [client.chat(MODEL_NAME, [{"role": "user", "content": f"count to {i}"}], max_tokens=OUTPUT,
                                 ignore_eos=True) for i in range(REQUESTS)]  # fmt: skip
            done = await asyncio.gather(*chats)
            after = (await client.metrics())["0"]
        return before, done, after

    before, done, after = asyncio.run(main())
    assert after.num_gpu_blocks == SMALL_KV_BLOCKS and after.block_size == 32
    assert all(c.completion_tokens == OUTPUT and c.finish_reason == "length" for c in done)
    assert after.num_preemptions_total > before.num_preemptions_total


def test_the_pool_fails_over_when_a_replica_is_killed_between_turns(small_fleet):
    """Killed while none of its requests is in flight, the victim's sessions' next turns cannot connect (they never
    reached an engine), so they move to the survivor and every session finishes; the launcher starts it again."""
    survivor, victim = small_fleet.urls
    launcher_seen = len(small_fleet.launcher_log())
    first_turns = []
    all_started, killed = asyncio.Event(), asyncio.Event()

    async def session(pool: ServingPool, i: int) -> list[str]:
        messages = [{"role": "user", "content": f"session {i}"}]
        served = []
        async with pool.session(f"s{i}"):
            for turn in range(4):
                if turn == 1:
                    if i == 0:
                        await all_started.wait()  # every session has a replica and a finished turn, none in flight
                        os.killpg(small_fleet.replica_pid(1), signal.SIGKILL)  # the victim's whole process group
                        # Gone before the next turns go out: a request written to a server as it dies reads as one
                        # that reached its engine (the pool then never replays it), which is another test's case.
                        async with ReplicaClient(victim) as probe:
                            while await probe.health(1.0):
                                await asyncio.sleep(0.1)
                        killed.set()
                    await killed.wait()
                c = await pool.chat(f"s{i}", messages, max_tokens=60, ignore_eos=True)
                assert c.completion_tokens == 60
                served.append(c.replica)
                if turn == 0:
                    first_turns.append(i)
                    if len(first_turns) == 4:
                        all_started.set()
                messages += [{"role": "assistant", "content": c.text}, {"role": "user", "content": "more"}]
        return served

    async def main():
        # Round robin over sessions: two live on each replica (a KV pool this small reads as saturated to available_kv).
        async with ServingPool([survivor, victim], MODEL_NAME, policy="round_robin", scrape_interval_s=0.5,
                               failover_timeout_s=60) as pool:  # fmt: skip
            served = await asyncio.gather(*(session(pool, i) for i in range(4)))
            return served, pool.is_up(victim), pool.failovers

    served, victim_up, failovers = asyncio.run(main())
    print(f"\nfailover: {failovers} request(s) retried on the survivor; replicas per session: {served}")
    assert not victim_up and failovers <= 2  # each of the victim's sessions fails over once, unless a scrape was first
    assert sum(s[0] == victim for s in served) == 2  # two sessions lived on the victim before the kill
    assert all(s[1:] == [survivor] * 3 for s in served)  # and every session finished, on the survivor
    deadline = time.monotonic() + 30  # the launcher looks twice a second
    while "; starting it again (" not in small_fleet.launcher_log()[launcher_seen:] and time.monotonic() < deadline:
        time.sleep(0.5)
    said = small_fleet.launcher_log()[launcher_seen:]  # what the launcher said since the test began
    assert f"replica 1 ({victim}) exited with code" in said and "; starting it again (" in said
    assert small_fleet.proc.poll() is None  # its launcher lives on, the survivor serving and the victim restarting
