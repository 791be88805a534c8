"""ServingPool over real HTTP: sticky sessions, least-loaded placement, admission, failover."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest
from serving_support import SimProcesses, wait_healthy

from terminus_env.serving.admission import AdaptiveAdmission, FixedAdmission
from terminus_env.serving.client import (
    ContextLengthExceeded,
    ReplicaClient,
    ReplicaUnavailable,
    ServingError,
)
from terminus_env.serving.pool import ServingPool
from terminus_env.serving.sim.engine import SimConfig
from terminus_env.serving.sim.replies import ScriptedReplies
from terminus_env.serving.sim.server import ServerConfig, SimServer

FAST = ServerConfig(model="m", time_scale=0.0)


def run(coro, timeout=90):
    return asyncio.run(asyncio.wait_for(coro, timeout=timeout))


async def rollout(
    pool: ServingPool,
    session_id: str,
    turns: int,
    group_id: str | None = None,
    first_turn_done: asyncio.Event | None = None,
) -> list[str]:
    """A minimal agent loop: ``turns`` chat turns in one session; returns the replica of each turn."""
    messages = [{"role": "user", "content": f"task for {session_id}: do the thing"}]
    replicas = []
    async with pool.session(session_id, group_id):
        for turn in range(turns):
            c = await pool.chat(session_id, messages, max_tokens=2000, group_id=group_id)
            replicas.append(c.replica)
            if first_turn_done is not None:
                first_turn_done.set()
            messages += [{"role": "assistant", "content": c.text}, {"role": "user", "content": f"output {turn}"}]
    return replicas


def test_sessions_stick_and_spread():
    async def main():
        async with (
            SimServer(FAST) as a,
            SimServer(FAST) as b,
            ServingPool([a.url, b.url], "m", policy="requests", scrape_interval_s=0.05) as pool,
        ):
            sessions = [f"s{i}" for i in range(6)]
            runs = await asyncio.gather(*(rollout(pool, s, 4) for s in sessions))
            released = [pool.router.replica_of(s) for s in sessions]
            await asyncio.sleep(0.2)  # a scrape after the last turn
            hits = sum(m.prefix_cache_hits_total for m in pool.latest_metrics().values())
            return runs, released, hits, [a.url, b.url]

    runs, released, hits, urls = run(main())
    assert all(len(set(r)) == 1 and len(r) == 4 for r in runs)  # every turn of a session on one replica
    assert sorted(sum(r[0] == url for r in runs) for url in urls) == [3, 3]
    assert released == [None] * 6  # the router forgot each session when it ended
    assert hits > 0  # follow-up turns reused their prefix on the sticky replica


def test_new_sessions_go_to_the_least_loaded_replica():
    preload = ScriptedReplies([("PRELOAD", ["long " * 400])], ["ok"])
    slow = ServerConfig(model="m", time_scale=1.0)

    async def main():
        async with SimServer(slow, preload) as busy, SimServer(FAST) as idle, ReplicaClient(busy.url) as direct:
            loading = [
                asyncio.create_task(
                    direct.chat("m", [{"role": "user", "content": f"PRELOAD {i} " + "ctx " * 3000}], max_tokens=1000)
                )
                for i in range(4)
            ]
            while busy.replicas[0].metrics().num_requests_running < 4:
                await asyncio.sleep(0.02)
            async with ServingPool([busy.url, idle.url], "m", scrape_interval_s=0.1) as pool:
                seen = pool.latest_metrics()[busy.url]
                runs = await asyncio.gather(*(rollout(pool, f"new{i}", 2) for i in range(4)))
            for task in loading:
                task.cancel()
            await asyncio.gather(*loading, return_exceptions=True)
            while busy.replicas[0].has_work():  # hung-up clients' requests are aborted, as vLLM does
                await asyncio.sleep(0.02)
            return seen, runs, idle.url

    seen, runs, idle_url = run(main())
    assert seen.num_requests_running == 4 and seen.kv_cache_usage > 0.17
    assert all(r == [idle_url, idle_url] for r in runs)


def test_admission_caps_live_sessions():
    admission = FixedAdmission(2)
    live = {"now": 0, "max": 0}

    async def one(pool, i):
        async with pool.session(f"s{i}"):
            live["now"] += 1
            live["max"] = max(live["max"], live["now"])
            await pool.chat(f"s{i}", [{"role": "user", "content": "hi"}], max_tokens=50)
            await asyncio.sleep(0.05)
            live["now"] -= 1

    async def main():
        async with SimServer(FAST) as a, ServingPool([a.url], "m", admission=admission, scrape_interval_s=0.05) as pool:
            await asyncio.gather(*(one(pool, i) for i in range(6)))

    run(main())
    assert live["max"] == 2 and admission.in_flight == 0


def test_adaptive_admission_is_told_where_each_session_went():
    admission = AdaptiveAdmission(pipeline_cap=8, prior_trace_tokens=500)

    async def one(pool, session):
        async with pool.session(session):
            c = await pool.chat(session, [{"role": "user", "content": f"hi from {session}"}], max_tokens=50)
            return c.replica, admission.replica_of(session)

    async def main():
        async with (
            SimServer(FAST) as a,
            SimServer(FAST) as b,
            ServingPool([a.url, b.url], "m", admission=admission, scrape_interval_s=0.05) as pool,
        ):
            await asyncio.sleep(0.2)  # a scrape: the controller learns both replicas' KV
            return await asyncio.gather(*(one(pool, f"s{i}") for i in range(4)))

    placed = run(main())
    assert all(served == charged for served, charged in placed)  # its KV is charged where it runs
    assert len({served for served, _ in placed}) == 2 and admission.in_flight == 0


def test_rebalance_moves_a_session_off_a_saturated_replica_between_turns():
    preload = ScriptedReplies([("PRELOAD", ["long " * 2000])], ["ok"])
    small = ServerConfig(model="m", time_scale=1.0, engine=SimConfig(num_gpu_blocks=257, max_model_len=4096))

    async def main():
        async with (
            SimServer(small, preload) as busy,
            SimServer(FAST) as idle,
            ReplicaClient(busy.url) as direct,
            ServingPool([busy.url, idle.url], "m", scrape_interval_s=0.05, rebalance=True) as pool,
        ):
            pool.router.mark_down(idle.url)  # the session starts on the small replica
            messages = [{"role": "user", "content": "task: do the thing"}]
            homes = []
            async with pool.session("s"):
                for turn in range(3):  # the default cooldown: three turns at home
                    c = await pool.chat("s", messages, max_tokens=50)
                    homes.append(c.replica)
                    messages += [{"role": "assistant", "content": c.text}, {"role": "user", "content": f"out {turn}"}]
                pool.router.mark_up(idle.url)
                loading = [
                    asyncio.create_task(
                        direct.chat("m", [{"role": "user", "content": f"PRELOAD {i} " + "ctx " * 900}], max_tokens=2000)
                    )
                    for i in range(3)
                ]

                def busy_usage() -> float:
                    metrics = pool.latest_metrics().get(busy.url)
                    return 0.0 if metrics is None else metrics.kv_cache_usage

                while busy_usage() < 0.8:
                    await asyncio.sleep(0.02)
                moved = await pool.chat("s", messages, max_tokens=50)
            for task in loading:
                task.cancel()
            await asyncio.gather(*loading, return_exceptions=True)
            return homes, moved.replica, pool.router.migrations, busy.url, idle.url

    homes, moved, migrations, busy_url, idle_url = run(main())
    assert homes == [busy_url] * 3
    assert moved == idle_url and migrations == 1


def test_context_length_is_typed_and_keeps_the_replica_up():
    config = ServerConfig(model="m", time_scale=0.0, engine=SimConfig(num_gpu_blocks=64, max_model_len=100))

    async def main():
        async with SimServer(config) as a, ServingPool([a.url], "m", scrape_interval_s=0.05) as pool:
            async with pool.session("s"):
                with pytest.raises(ContextLengthExceeded, match="maximum context length is 100"):
                    await pool.chat("s", [{"role": "user", "content": "w " * 300}], max_tokens=10)
                ok = await pool.chat("s", [{"role": "user", "content": "short"}], max_tokens=10)
            return pool.is_up(a.url), ok

    up, ok = run(main())
    assert up and ok.completion_tokens > 0


def test_a_turn_limit_above_the_models_context_says_what_to_lower():
    """vLLM refuses max_tokens above max_model_len outright (not a context overflow of the conversation)."""
    config = ServerConfig(model="m", time_scale=0.0, engine=SimConfig(num_gpu_blocks=64, max_model_len=100))

    async def main():
        async with SimServer(config) as a, ServingPool([a.url], "m", scrape_interval_s=0.05) as pool:
            async with pool.session("s"):
                with pytest.raises(ServingError, match="--max-turn-tokens") as refused:
                    await pool.chat("s", [{"role": "user", "content": "hi"}], max_tokens=16384)
        return refused.value

    assert not isinstance(run(main()), ContextLengthExceeded)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_replica_at_all_is_a_clear_error_after_the_timeout():
    async def main():
        url = f"http://127.0.0.1:{_free_port()}"
        async with ServingPool([url], "m", scrape_interval_s=0.05, failover_timeout_s=0.5) as pool:
            assert not pool.is_up(url)
            start = time.monotonic()
            with pytest.raises(ReplicaUnavailable, match="no replica"):
                await pool.chat("s", [{"role": "user", "content": "hi"}], max_tokens=5)
            return time.monotonic() - start

    assert 0.4 < run(main()) < 5


def test_failover_when_a_server_process_dies(tmp_path):
    """Kill one server mid-turn: its sessions move, the in-flight turns are retried, no rollout is lost;
    a server started again on that port is probed back up and takes new sessions."""
    script = tmp_path / "replies.jsonl"
    # Turn 2 is long (~1.5 s at this time scale), so it is surely in flight when the victim dies.
    script.write_text(json.dumps({"match": "task for", "replies": ["look", "step " * 300, "done"]}) + "\n")
    procs = SimProcesses(tmp_path)
    args = ("--model", "m", "--time-scale", "0.5", "--replies", str(script))

    async def main():
        victim, victim_url = procs.start(*args)
        _, survivor_url = procs.start(*args)
        async with ServingPool(
            [victim_url, survivor_url], "m", policy="requests", scrape_interval_s=0.1, failover_timeout_s=30
        ) as pool:
            done = [asyncio.Event() for _ in range(4)]
            runs = asyncio.gather(*(rollout(pool, f"s{i}", 3, first_turn_done=done[i]) for i in range(4)))
            for event in done:
                await event.wait()
            await asyncio.sleep(0.2)
            victim.kill()
            first = await runs
            down = not pool.is_up(victim_url)
            failovers = pool.failovers
            port = int(victim_url.rsplit(":", 1)[1])
            procs.start(*args, port=port)
            wait_healthy(victim_url)
            deadline = time.monotonic() + 5
            while not pool.is_up(victim_url) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            later = await asyncio.gather(*(rollout(pool, f"t{i}", 1) for i in range(4)))
            return first, down, failovers, later, victim_url, survivor_url

    try:
        first, down, failovers, later, victim_url, survivor_url = run(main())
    finally:
        procs.close()
    assert all(len(turns) == 3 for turns in first)  # no rollout lost
    # The victim's two sessions: turn 1 there, turn 2 (in flight at the kill) retried on the survivor.
    assert sorted(first) == sorted([[survivor_url] * 3] * 2 + [[victim_url, survivor_url, survivor_url]] * 2)
    assert down and failovers == 2
    assert any(turns == [victim_url] for turns in later)  # back up, it takes new sessions
