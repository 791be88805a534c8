"""The simulated vLLM server over real HTTP, through the replica client."""

from __future__ import annotations

import asyncio
import json
import signal

import httpx
import pytest
from serving_support import until

from terminus_env.serving.client import ContextLengthExceeded, ReplicaClient, ReplicaUnavailable, ServingError
from terminus_env.serving.sim import server as sim_server
from terminus_env.serving.sim.engine import SimConfig
from terminus_env.serving.sim.replies import DEFAULT_REPLY, ScriptedReplies, load_reply_source
from terminus_env.serving.sim.server import ServerConfig, SimServer
from terminus_env.serving.sim.tokenizer import IM_END

FAST = ServerConfig(model="m", time_scale=0.0)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=60))


def test_turns_share_their_prefix_and_carry_token_ids():
    async def main():
        async with SimServer(FAST) as server, ReplicaClient(server.url) as client:
            messages = [
                {"role": "system", "content": "You drive a terminal. " * 10},
                {"role": "user", "content": "Task: list the files."},
            ]
            first = await client.chat("m", messages, max_tokens=1000)
            messages += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "ok, go on"}]
            second = await client.chat("m", messages, max_tokens=1000)
            engines = await client.metrics()
            return first, second, engines

    first, second, engines = run(main())
    assert first.text == DEFAULT_REPLY and first.finish_reason == "stop"
    assert first.token_ids[-1] == IM_END and len(first.token_ids) == first.completion_tokens
    assert len(first.prompt_token_ids) == first.prompt_tokens
    assert len(first.logprobs) == first.completion_tokens and all(lp <= 0 for lp in first.logprobs)
    # The second prompt starts with the first prompt and the first reply, token for token.
    assert second.prompt_token_ids[: first.prompt_tokens + first.completion_tokens] == (
        first.prompt_token_ids + first.token_ids
    )
    m = engines["0"]
    assert m.prompt_tokens_total == first.prompt_tokens + second.prompt_tokens
    assert m.generation_tokens_total == first.completion_tokens + second.completion_tokens
    assert m.prefix_cache_queries_total == m.prompt_tokens_total
    # Turn 1's prompt and reply blocks are cached, as vLLM caches generated blocks too.
    assert m.prefix_cache_hits_total >= ((first.prompt_tokens + first.completion_tokens) // 16) * 16 > 0
    assert (m.block_size, m.num_gpu_blocks, m.num_requests_running) == (16, 4096, 0)


def test_max_tokens_cuts_with_finish_reason_length():
    async def main():
        async with SimServer(FAST) as server, ReplicaClient(server.url) as client:
            return await client.chat("m", [{"role": "user", "content": "hi"}], max_tokens=4)

    c = run(main())
    assert (c.finish_reason, c.completion_tokens, len(c.token_ids)) == ("length", 4, 4)
    assert DEFAULT_REPLY.startswith(c.text) and c.text


def words(n: int) -> list[dict]:
    """A conversation whose prompt is ``n`` tokens with the toy tokenizer (a message costs 3 besides its words, and
    the assistant's opener 2)."""
    return [{"role": "user", "content": "word " * (n - 5)}]


def test_context_length_rules_match_vllm():
    """vLLM 0.32, at the context's boundary and around it: a prompt one token short is granted one token, cut with
    length where prompt and reply fill the context; a prompt of exactly the context is refused as vLLM's sampling
    parameters refuse the 0 tokens left; a longer one for its length, with vLLM's count capped at the context + 1;
    a max_tokens above max_model_len is refused before the prompt is read. The client reads all three boundary
    refusals as the context's end, and the other as the caller's error."""
    config = ServerConfig(model="m", time_scale=0.0, engine=SimConfig(num_gpu_blocks=64, max_model_len=100))

    async def main():
        async with SimServer(config) as server, ReplicaClient(server.url) as client:
            short = await client.chat("m", words(99), max_tokens=50, ignore_eos=True)
            refused = {}
            for n in (100, 101, 150):
                with pytest.raises(ContextLengthExceeded) as exhausted:
                    await client.chat("m", words(n), max_tokens=10)
                refused[n] = exhausted.value.reason
            with pytest.raises(ServingError) as too_many:
                await client.chat("m", words(150), max_tokens=101)
            cut = await client.chat("m", words(50), max_tokens=60, ignore_eos=True)
            raw = await client._http.post("/v1/chat/completions", json={"model": "m", "messages": words(100)})
            counted = await client.prompt_tokens("m", words(100))
            return short, refused, too_many.value, cut, raw, counted

    short, refused, too_many, cut, raw, counted = run(main())
    assert (short.prompt_tokens, short.completion_tokens, short.finish_reason) == (99, 1, "length")
    assert refused[100] == "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)"
    for n in (101, 150):
        assert refused[n] == (
            "This model's maximum context length is 100 tokens. However, your prompt contains at least 101 input "
            "tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input "
            "prompt. (parameter=input_tokens, value=101)"
        )
    assert not isinstance(too_many, ContextLengthExceeded)
    assert "max_tokens=101 cannot be greater than max_model_len=100" in str(too_many)
    assert cut.finish_reason == "length" and cut.prompt_tokens + cut.completion_tokens == 100
    assert raw.status_code == 400  # no max_tokens asks for the room left, and there is none
    error = raw.json()["error"]
    assert error["type"] == "BadRequestError" and error["code"] == 400 and error["param"] == "max_tokens"
    assert counted == 100


def test_bad_requests_are_clear_errors():
    async def main():
        async with SimServer(FAST) as server, ReplicaClient(server.url) as client:
            with pytest.raises(ServingError, match="does not exist"):
                await client.chat("other-model", [{"role": "user", "content": "hi"}], max_tokens=4)
            with pytest.raises(ServingError, match="messages"):
                await client.chat("m", [], max_tokens=4)
            with pytest.raises(ServingError, match="max_tokens must be at least 1"):
                await client.chat("m", [{"role": "user", "content": "hi"}], max_tokens=0)
            not_json = await client._http.post("/v1/chat/completions", content=b"{nope")
            missing = await client._http.get("/v2/none")
            models = (await client._http.get("/v1/models")).json()
            return not_json.status_code, missing.status_code, models, await client.health()

    not_json, missing, models, healthy = run(main())
    assert (not_json, missing, healthy) == (400, 404, True)
    assert models["data"][0]["id"] == "m" and models["data"][0]["max_model_len"] == 32768


def test_engines_share_a_port_and_a_rank_header_pins_one():
    config = ServerConfig(model="m", engines=2, time_scale=0.0)

    async def main():
        async with SimServer(config) as server, ReplicaClient(server.url) as client:
            for _ in range(3):
                await client.chat(
                    "m", [{"role": "user", "content": "hi"}], max_tokens=8, headers={"X-data-parallel-rank": "1"}
                )
            text = (await client._http.get("/metrics")).text
            return await client.metrics(), text

    engines, text = run(main())
    assert sorted(engines) == ["0", "1"]
    assert engines["1"].generation_tokens_total == 24 and engines["0"].generation_tokens_total == 0
    assert 'vllm:e2e_request_latency_seconds_count{engine="1",model_name="m"} 3.0' in text
    assert 'vllm:time_to_first_token_seconds_bucket{engine="1",le="0.001",model_name="m"}' in text
    assert 'vllm:request_queue_time_seconds_created{engine="1",model_name="m"}' in text


def test_scripted_replies_cycle_and_key(tmp_path):
    script = tmp_path / "replies.jsonl"
    script.write_text(
        "\n".join(
            json.dumps(x)
            for x in (
                {"reply": "one"},
                {"reply": "two"},
                {"match": "fix the bug", "replies": ["first turn", "second turn"]},
            )
        )
    )
    source = ScriptedReplies.from_file(script)
    task = [{"role": "user", "content": "please fix the bug"}]
    assert source(task) == "first turn"
    assert source(task + [{"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}]) == "second turn"
    other = [{"role": "user", "content": "hello"}]
    assert [source(other) for _ in range(3)] == ["one", "two", "one"]
    (tmp_path / "bad.jsonl").write_text('{"text": "x"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        ScriptedReplies.from_file(tmp_path / "bad.jsonl")


def test_reply_source_hook():
    source = load_reply_source("json:dumps")
    assert source([{"role": "user", "content": "hi"}]) == '[{"role": "user", "content": "hi"}]'
    with pytest.raises(ValueError, match="module:callable"):
        load_reply_source("json.dumps")
    with pytest.raises(ValueError, match="cannot import"):
        load_reply_source("json:nope")


def test_a_failing_reply_source_is_a_5xx():
    def broken(messages):
        raise RuntimeError("oracle crashed")

    async def main():
        async with SimServer(FAST, replies=broken) as server, ReplicaClient(server.url) as client:
            return await client._http.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            )

    response = run(main())
    assert response.status_code == 500 and "oracle crashed" in response.json()["error"]["message"]


def test_process_serves_and_stops_cleanly_on_sigterm(tmp_path):
    from serving_support import SimProcesses

    procs = SimProcesses(tmp_path)
    try:
        proc, url = procs.start(
            "--model", "m", "--engines", "2", "--num-gpu-blocks", "128", "--max-model-len", "512", "--time-scale", "0"
        )
        reply = httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
            timeout=10,
        ).json()
        assert reply["choices"][0]["finish_reason"] == "length"
        assert 'num_gpu_blocks="128"' in httpx.get(f"{url}/metrics", timeout=10).text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        procs.close()


def test_an_engine_that_crashes_fails_its_requests_and_health():
    async def main():
        async with SimServer(FAST) as server, ReplicaClient(server.url) as client:

            def crash():
                raise RuntimeError("engine bug")

            server.replicas[0].step = crash  # the engine's next step raises
            with pytest.raises(ReplicaUnavailable, match="engine bug"):
                await client.chat("m", [{"role": "user", "content": "hi"}], max_tokens=4)
            with pytest.raises(ReplicaUnavailable, match="engine bug"):  # later requests fail at once
                await client.chat("m", [{"role": "user", "content": "hi"}], max_tokens=4)
            return await client.health()

    assert run(main()) is False


def test_a_streamed_chat_is_the_same_completion_as_server_sent_events():
    async def main():
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100, "logprobs": True}
        async with SimServer(FAST) as server, httpx.AsyncClient(base_url=server.url) as http:
            plain = (await http.post("/v1/chat/completions", json=body)).json()
            streamed = await http.post(
                "/v1/chat/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}}
            )
            return plain, streamed

    plain, streamed = run(main())
    assert streamed.status_code == 200 and streamed.headers["content-type"].startswith("text/event-stream")
    events = [line.removeprefix("data: ") for line in streamed.text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert content == plain["choices"][0]["message"]["content"] == DEFAULT_REPLY
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finish == ["stop"] and chunks[-1]["usage"]["completion_tokens"] == plain["usage"]["completion_tokens"]


def test_each_reply_names_the_server_and_metrics_say_how_far_the_engine_ran_behind():
    slow_cpu = ServerConfig(model="m", time_scale=1e-6)  # a step's deadline passes before the step is done

    async def main():
        async with SimServer(FAST) as fast, SimServer(slow_cpu) as behind, httpx.AsyncClient(timeout=10) as http:
            out = []
            for server in (fast, behind):
                body = {"model": "m", "messages": [{"role": "user", "content": "w " * 2000}], "max_tokens": 50}
                response = await http.post(f"{server.url}/v1/chat/completions", json=body)
                lag = [line for line in (await http.get(f"{server.url}/metrics")).text.splitlines()
                       if line.startswith("terminus_sim:max_lag_seconds{")]
                out.append((response.headers["x-sim-replica"], server.port, float(lag[0].rsplit(" ", 1)[1])))
            return out

    (fast_name, fast_port, fast_lag), (behind_name, behind_port, behind_lag) = run(main())
    assert fast_name == f"127.0.0.1:{fast_port}" and behind_name == f"127.0.0.1:{behind_port}"
    assert fast_lag == 0.0  # time scale 0 has no wall clock to keep
    assert behind_lag > 0.4  # 50+ steps of >= 8 simulated ms each, every one overdue


def test_every_engine_setting_is_a_flag(tmp_path):
    from serving_support import SimProcesses

    procs = SimProcesses(tmp_path)
    try:
        _, url = procs.start("--model", "m", "--time-scale", "0", "--step-base-s", "0.5", "--max-num-batched-tokens",
                             "64", "--no-enable-prefix-caching", "--num-gpu-blocks", "100", "--max-model-len", "1024")
        body = {"model": "m", "messages": [{"role": "user", "content": "w " * 300}], "max_tokens": 1}
        httpx.post(f"{url}/v1/chat/completions", json=body, timeout=10)
        text = httpx.get(f"{url}/metrics", timeout=10).text
    finally:
        procs.close()
    # 300+ prompt tokens in chunks of 64 is 5 steps of at least 0.5 simulated seconds each
    assert 'vllm:time_to_first_token_seconds_bucket{engine="0",le="2.5",model_name="m"} 0.0' in text
    assert 'vllm:time_to_first_token_seconds_bucket{engine="0",le="5.0",model_name="m"} 1.0' in text
    assert 'enable_prefix_caching="False"' in text and 'num_gpu_blocks="100"' in text


def test_ignore_eos_generates_max_tokens_as_vllm_does():
    async def main():
        async with SimServer(FAST) as server, ReplicaClient(server.url) as client:
            return await client.chat("m", [{"role": "user", "content": "hi"}], max_tokens=500, ignore_eos=True)

    c = run(main())
    assert (c.finish_reason, c.completion_tokens, len(c.token_ids), len(c.logprobs)) == ("length", 500, 500, 500)
    assert c.text == DEFAULT_REPLY and c.token_ids[len(c.text.split())] == IM_END  # the reply, its end, then more


def test_a_shared_host_slows_steps_and_holds_requests_in_the_frontend_by_the_requests_open(tmp_path, monkeypatch):
    """CPU replicas' measured losses (SimConfig.step_contention, frontend_s) change the simulated time only."""
    from terminus_env.serving.sim.engine import SimReplica, SimRequest

    plain = SimConfig(step_base_s=0.01, step_per_token_s=0.0, step_per_seq_s=0.0, step_per_context_token_s=0.0,
                      step_per_token_pair_s=0.0)
    shared = SimConfig(**{**plain.__dict__, "step_contention": ((1, 1.0), (3, 3.0))})
    times = []
    for config in (plain, shared):
        replica = SimReplica(config)
        for i in range(3):  # three requests held: the curve says 3x
            replica.submit(SimRequest(f"r{i}", (1, 2, 3 + i), 1, 1))
        times.append(replica.step())
    assert times == [pytest.approx(0.01), pytest.approx(0.03)]

    held = ServerConfig(model="m", time_scale=0.02, engine=SimConfig(frontend_s=((1, 0.0), (2, 10.0))))
    holds: list[tuple[int, float]] = []  # (requests open, the hold) as the frontend decided each request's
    real_curve_at = sim_server.curve_at

    def recorded(curve: tuple[tuple[float, float], ...], x: float, default: float) -> float:
        holds.append((int(x), real_curve_at(curve, x, default)))
        return holds[-1][1]

    monkeypatch.setattr(sim_server, "curve_at", recorded)

    async def main():
        async with SimServer(held) as server, ReplicaClient(server.url) as client:
            loop = asyncio.get_running_loop()
            replica = server.replicas[0]

            async def timed(text: str, tokens: int) -> float:
                t0 = loop.time()
                await client.chat("m", [{"role": "user", "content": text}], max_tokens=tokens, ignore_eos=True)
                return loop.time() - t0

            await timed("hi", 2)  # nothing else open: no hold
            # 1,000 steps of 8 simulated ms: 8 simulated s, 0.16 real s; a short request sent meanwhile is the
            # second open and is held 10 simulated s (0.2 real s) before its first step
            long = asyncio.create_task(timed("long", 1000))
            await until(replica.has_work, "the long request in the engine")
            second = asyncio.create_task(timed("short", 2))
            await until(lambda: replica.frontend_open == 1 or second.done(), "the short request held in the frontend")
            held_seen = replica.frontend_open == 1
            return await second, held_seen, await long

    second, held_seen, long = run(main())
    assert holds == [(1, 0.0), (1, 0.0), (2, 10.0)] and held_seen and long > 0
    assert second > 0.2 - 0.01  # 10 simulated s at 0.02 real s each (a busy host only makes it longer)


def test_a_curve_is_a_flag_and_a_bad_one_is_refused(tmp_path):
    from serving_support import SimProcesses

    from terminus_env.serving.sim.config import format_curve, parse_curve

    assert parse_curve(format_curve(((1.5, 2.0), (4.0, 3.25)))) == ((1.5, 2.0), (4.0, 3.25)) and parse_curve("") == ()
    with pytest.raises(ValueError, match="rising x"):
        SimConfig(frontend_s=((2.0, 0.1), (1.0, 0.2)))
    with pytest.raises(ValueError, match="x:y"):
        parse_curve("1:2,three:4")
    procs = SimProcesses(tmp_path)
    try:  # one step of a 1-token answer, held 0.5 s: at least 5 simulated seconds
        _, url = procs.start("--model", "m", "--time-scale", "0.1", "--step-base-s", "0.001", "--step-contention",
                             "1:5000")
        body = {"model": "m", "messages": [{"role": "user", "content": "w"}], "max_tokens": 1}
        httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)
        text = httpx.get(f"{url}/metrics", timeout=10).text
    finally:
        procs.close()
    assert 'vllm:e2e_request_latency_seconds_bucket{engine="0",le="2.5",model_name="m"} 0.0' in text
    assert 'vllm:e2e_request_latency_seconds_bucket{engine="0",le="10.0",model_name="m"} 1.0' in text
