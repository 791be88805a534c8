"""ServingPool over real HTTP: sticky sessions, least-loaded placement, admission, failover."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time

import httpx
import pytest
from serving_support import SimProcesses, until, wait_healthy

from terminus_env.serving.admission import AdaptiveAdmission, FixedAdmission
from terminus_env.serving.client import (
    ContextLengthExceeded,
    EngineDied,
    ReplicaClient,
    ReplicaUnavailable,
    ServingError,
)
from terminus_env.serving.pool import SCRAPES_MISSED_DOWN, ServingPool, down_after_scrape
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


def test_a_replica_too_busy_to_answer_a_scrape_stays_up_until_it_misses_several_in_a_row():
    """A CPU replica writing a long reply can leave a /metrics scrape unanswered past its timeout; marking it down
    for that moved its sessions away and left it out of a weight sync. Timeouts count only several in a row; a
    refused connection (nothing listening) or a 5xx marks it down at once."""
    timeout = ReplicaUnavailable("http://a/metrics: timed out (ConnectTimeout)", delivered=False, timed_out=True)
    refused = ReplicaUnavailable("http://a/metrics: ConnectError: refused", delivered=False)
    missed, verdicts = 0, []
    for _ in range(SCRAPES_MISSED_DOWN):
        down, missed = down_after_scrape(timeout, missed)
        verdicts.append(down)
    assert SCRAPES_MISSED_DOWN > 1 and verdicts == [False] * (SCRAPES_MISSED_DOWN - 1) + [True]
    assert down_after_scrape(refused, 0)[0] and down_after_scrape(refused, 1)[0]


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
            await pool._scrape_all()  # the replicas' counters after the last turn
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
            await pool._scrape_all()  # the controller learns both replicas' KV (as the start's scrape did)
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


def test_a_turn_limit_above_the_models_context_asks_for_what_fits():
    """vLLM refuses max_tokens above max_model_len outright: the pool asks for at most the context length its
    /v1/models reports, the engine cuts that to the room the prompt leaves, and the completion says the context."""
    config = ServerConfig(model="m", time_scale=0.0, engine=SimConfig(num_gpu_blocks=64, max_model_len=100))

    async def main():
        async with SimServer(config) as a, ServingPool([a.url], "m", scrape_interval_s=0.05) as pool:
            async with pool.session("s"):
                filled = await pool.chat("s", [{"role": "user", "content": "hi"}], max_tokens=16384, ignore_eos=True)
            async with ReplicaClient(a.url) as alone:
                with pytest.raises(ServingError, match="at most its max_model_len") as refused:
                    await alone.chat("m", [{"role": "user", "content": "hi"}], max_tokens=16384)
        return filled, refused.value

    filled, refused = run(main())
    assert filled.finish_reason == "length" and filled.max_model_len == 100
    assert filled.prompt_tokens + filled.completion_tokens == 100
    assert not isinstance(refused, ContextLengthExceeded)


def test_a_server_that_refuses_a_reply_overflowing_with_the_prompt_is_asked_for_the_room_left():
    """vLLM before it cut such requests refused them with the counts in its message (a 400 naming the context):
    the client asks again for the room the prompt leaves, once, rather than ending the episode at its context."""
    asked = []

    def old_vllm(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        asked.append(body["max_tokens"])
        if body["max_tokens"] > 60:
            message = ("This model's maximum context length is 100 tokens. However, you requested 140 tokens (40 in "
                       "the messages, 100 in the completion). Please reduce the length of the messages or completion.")
            return httpx.Response(400, json={"message": message})
        return httpx.Response(200, json={
            "choices": [{"message": {"content": "ok"}, "finish_reason": "length", "token_ids": [1] * 60,
                         "logprobs": None}],
            "usage": {"prompt_tokens": 40, "completion_tokens": 60}, "prompt_token_ids": [2] * 40})  # fmt: skip

    full = httpx.Response(400, json={"message": "This model's maximum context length is 100 tokens. However, you "
                                     "requested 160 tokens (100 in the messages, 60 in the completion)."})  # fmt: skip

    async def main():
        async with ReplicaClient("http://x", transport=httpx.MockTransport(old_vllm)) as client:
            done = await client.chat("m", [{"role": "user", "content": "hi"}], max_tokens=100)
        async with ReplicaClient("http://x", transport=httpx.MockTransport(lambda request: full)) as client:
            with pytest.raises(ContextLengthExceeded):  # a prompt that fills the context is still the context's end
                await client.chat("m", [{"role": "user", "content": "hi"}], max_tokens=60)
        return done

    done = run(main())
    assert asked == [100, 60] and done.completion_tokens == 60


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

    assert run(main()) > 0.4  # it waited out the failover timeout (a busy host only makes that longer)


def test_a_server_that_dies_between_turns_hands_its_sessions_to_the_others(tmp_path):
    """Kill one server while no request is at it: the next turn of each of its sessions cannot connect (it never
    reached an engine), so it goes to the survivor; no rollout is lost. A server started again on that port is
    probed back up and takes new sessions."""
    procs = SimProcesses(tmp_path)
    args = ("--model", "m", "--time-scale", "0")

    async def main():
        victim, victim_url = procs.start(*args)
        _, survivor_url = procs.start(*args)
        async with ServingPool(
            [victim_url, survivor_url], "m", policy="requests", scrape_interval_s=0.1, failover_timeout_s=30
        ) as pool:
            turns: dict[str, list[str]] = {}
            async with contextlib.AsyncExitStack() as stack:
                for i in range(4):
                    await stack.enter_async_context(pool.session(f"s{i}"))
                messages = {f"s{i}": [{"role": "user", "content": f"task for s{i}"}] for i in range(4)}
                for sid in messages:
                    turns[sid] = [(await pool.chat(sid, messages[sid], max_tokens=20)).replica]
                victim.kill()
                victim.wait()
                for sid in messages:
                    messages[sid] += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "next"}]
                    turns[sid].append((await pool.chat(sid, messages[sid], max_tokens=20)).replica)
            down, failovers = not pool.is_up(victim_url), pool.failovers
            procs.start(*args, port=int(victim_url.rsplit(":", 1)[1]))
            wait_healthy(victim_url)
            await until(lambda: pool.is_up(victim_url), "the restarted replica probed back up")
            later = await asyncio.gather(*(rollout(pool, f"t{i}", 1) for i in range(4)))
            return turns, down, failovers, later, victim_url, survivor_url

    try:
        turns, down, failovers, later, victim_url, survivor_url = run(main())
    finally:
        procs.close()
    assert sorted(turns.values()) == sorted([[survivor_url] * 2] * 2 + [[victim_url, survivor_url]] * 2)
    # The first turn that finds it dead fails over (none does if a scrape found it first); then the router knows.
    assert down and failovers in (0, 1)
    assert any(t == [victim_url] for t in later)  # back up, it takes new sessions


def test_requests_at_a_server_that_dies_are_not_replayed_elsewhere(tmp_path):
    """Kill one server while turns are in flight there: the engine may have died of them, so they fail with
    EngineDied naming their session instead of going to the survivor; the survivor's sessions finish."""
    script = tmp_path / "replies.jsonl"
    # Turn 2 is long (~1.5 s at this time scale): the victim dies while it runs there.
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
            runs = asyncio.gather(
                *(rollout(pool, f"s{i}", 3, first_turn_done=done[i]) for i in range(4)), return_exceptions=True
            )
            for event in done:
                await event.wait()
            placed = {f"s{i}": pool.router.replica_of(f"s{i}") for i in range(4)}
            on_victim = sum(url == victim_url for url in placed.values())
            async with ReplicaClient(victim_url) as client:  # the victim's sessions' second turns running there
                while sum(m.num_requests_running for m in (await client.metrics()).values()) < on_victim:
                    await asyncio.sleep(0.01)
            victim.kill()
            return await runs, placed, pool.failovers, pool.is_up(victim_url), victim_url, survivor_url

    try:
        results, placed, failovers, victim_up, victim_url, survivor_url = run(main())
    finally:
        procs.close()
    for i, result in enumerate(results):
        if placed[f"s{i}"] == victim_url:
            assert isinstance(result, EngineDied), result
            assert f"session 's{i}'" in str(result) and "turn 2" in str(result) and "not sent to another" in str(result)
        else:
            assert result == [survivor_url] * 3
    assert sorted(placed.values()) == sorted([victim_url, survivor_url] * 2)
    assert failovers == 0 and not victim_up


def test_a_request_that_kills_its_engine_fails_alone_and_the_fleet_serves_on():
    """A request that crashes the engine it reaches (the simulator's crash_on, as a seeded request with a split
    prefill crashes vLLM's CPU build) is never sent to the next replica: one such request must not take the
    fleet down replica by replica. Other sessions are served by the replicas left."""
    config = ServerConfig(model="m", time_scale=0.0, crash_on="BOOM")

    async def main():
        async with (
            SimServer(config) as a,
            SimServer(config) as b,
            ServingPool([a.url, b.url], "m", policy="requests", scrape_interval_s=0.05) as pool,
        ):
            async with pool.session("poison"):
                first = await pool.chat("poison", [{"role": "user", "content": "hello"}], max_tokens=5)
                home = first.replica
                other = b.url if home == a.url else a.url
                before = (await ReplicaClient(other).metrics())["0"].prompt_tokens_total
                with pytest.raises(EngineDied) as died:
                    await pool.chat("poison", [{"role": "user", "content": "BOOM"}], max_tokens=5, seed=5)
                after = (await ReplicaClient(other).metrics())["0"].prompt_tokens_total
            others = await asyncio.gather(*(rollout(pool, f"s{i}", 2) for i in range(3)))
            return died.value, home, other, before, after, others, pool.is_up(home), pool.failovers

    died, home, other, before, after, others, home_up, failovers = run(main())
    message = str(died)
    assert f"replica {home}'s engine died" in message and "session 'poison'" in message and "turn 2" in message
    assert "'seed': 5" in message and "--no-enable-chunked-prefill" in message  # it names the likely cause
    assert "EngineCore encountered an issue" in message  # vLLM's own words, as the server answered them
    assert after == before and failovers == 0  # the request never reached the other replica
    assert others == [[other, other]] * 3 and not home_up  # the fleet serves on without the dead replica


def test_a_failure_at_a_replica_that_stays_healthy_is_retried_a_bounded_number_of_times():
    """An HTTP 500 from a replica that still answers /health (its reply source fails, its engine lives): the request
    may be tried again, but only twice more; then the request itself is what fails, and the replica stays up."""
    calls = []

    def broken(messages: list[dict]) -> str:
        calls.append(messages)
        raise RuntimeError("no reply for this one")

    async def main():
        async with SimServer(FAST, broken) as a, ServingPool([a.url], "m", scrape_interval_s=0.05) as pool:
            async with pool.session("s"):
                with pytest.raises(ServingError, match="failed 3 times at replicas that stayed healthy") as failed:
                    await pool.chat("s", [{"role": "user", "content": "hi"}], max_tokens=5)
            return failed.value, pool.is_up(a.url)

    failed, up = run(main())
    assert not isinstance(failed, EngineDied | ReplicaUnavailable) and "no reply for this one" in str(failed)
    assert len(calls) == 3 and up


def test_the_client_says_whether_a_failed_request_reached_the_server():
    async def main():
        refused = ReplicaClient(f"http://127.0.0.1:{_free_port()}")
        dropped = ReplicaClient("http://x", transport=httpx.MockTransport(_raise(httpx.ReadError("reset"))))
        answered = ReplicaClient("http://x", transport=httpx.MockTransport(lambda r: httpx.Response(502, text="no")))
        out = []
        for client in (refused, dropped, answered):
            with pytest.raises(ReplicaUnavailable) as failed:
                await client.chat("m", [{"role": "user", "content": "hi"}], max_tokens=1)
            out.append(failed.value.delivered)
            await client.aclose()
        return out

    assert run(main()) == [False, True, True]


def _raise(exc: Exception):
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    return handler


def test_a_pool_for_a_model_the_replica_does_not_serve_says_which_it_serves():
    async def main():
        async with SimServer(ServerConfig(model="served-name", time_scale=0.0)) as a:
            pool = ServingPool([a.url], "/path/it/was/started/from")
            with pytest.raises(ServingError, match="serves 'served-name', not '/path/it/was/started/from'"):
                await pool.start()
            await pool.aclose()

    run(main())


def test_a_dropped_health_probe_is_asked_again_before_an_engine_is_called_dead():
    """After a request fails, the pool asks the replica's /health before calling its engine dead. A probe that lands
    on a stale keep-alive connection, or on one reset under load, must be asked again: one such drop after another
    once ended a whole benchmark run with a false EngineDied. A refused connection or a non-200 answer is final."""
    calls = {"flaky": 0, "sick": 0, "dropping": 0, "refused": 0}

    def flaky(request: httpx.Request) -> httpx.Response:
        calls["flaky"] += 1
        if calls["flaky"] <= 2:
            raise httpx.ReadError("connection reset by peer")
        return httpx.Response(200)

    def sick(request: httpx.Request) -> httpx.Response:
        calls["sick"] += 1
        return httpx.Response(500, text="EngineCore encountered an issue")

    def counted(name: str, error: Exception) -> httpx.MockTransport:
        def answer(request: httpx.Request) -> httpx.Response:
            calls[name] += 1
            raise error

        return httpx.MockTransport(answer)

    async def main():
        clients = {
            "flaky": ReplicaClient("http://x", transport=httpx.MockTransport(flaky)),
            "sick": ReplicaClient("http://x", transport=httpx.MockTransport(sick)),
            "dropping": ReplicaClient("http://x", transport=counted("dropping", httpx.ReadError("reset"))),
            "refused": ReplicaClient("http://x", transport=counted("refused", httpx.ConnectError("refused"))),
            "nothing listens": ReplicaClient(f"http://127.0.0.1:{_free_port()}"),
        }
        out = {}
        for name, client in clients.items():
            started = time.monotonic()
            out[name] = (await client.still_alive(1.5), time.monotonic() - started)
            await client.aclose()
        return out

    out = run(main())
    assert out["flaky"][0] and calls["flaky"] == 3
    assert not out["sick"][0] and calls["sick"] == 1  # a non-200 answer is final: asked once
    assert not out["refused"][0] and calls["refused"] == 1 and not out["nothing listens"][0]
    assert not out["dropping"][0] and calls["dropping"] >= 2 and out["dropping"][1] >= 1.4  # asked again, all window
