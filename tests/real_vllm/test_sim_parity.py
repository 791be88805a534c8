"""The simulated replica against the real engine: the same client code, the same shapes, or the test fails.

Values differ (the simulator samples nothing); the structure may not: every field of a chat completion, streamed
or not, of an error and of ``/v1/models``, and every ``/metrics`` family the simulator exposes, with its labels.
"""

from __future__ import annotations

import asyncio
import json

import httpx
from vllm_support import MODEL_NAME

from terminus_env.serving.client import ReplicaClient
from terminus_env.serving.metrics import _CACHE_CONFIG, _COUNTERS, _GAUGES
from terminus_env.serving.sim.engine import SimConfig
from terminus_env.serving.sim.server import ServerConfig, SimServer
from terminus_env.serving.sim.tokenizer import TemplateTokenizer

MESSAGES = [{"role": "user", "content": "list the files"}]
CHAT = {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 5, "logprobs": True, "return_token_ids": True,
        "ignore_eos": True}  # five tokens from both, whatever they say


def shape(value):
    """A JSON value's structure: keys and value types; a list of objects by its items' shapes, any other
    ``"list"`` (an empty list of ids and a full one have one shape)."""
    if isinstance(value, dict):
        return {key: shape(v) for key, v in sorted(value.items())}
    if isinstance(value, list):
        if not any(isinstance(v, (dict, list)) for v in value):
            return "list"
        items = {json.dumps(shape(v), sort_keys=True) for v in value}
        return [json.loads(s) for s in sorted(items)]
    return "number" if isinstance(value, (int, float)) and not isinstance(value, bool) else type(value).__name__


def stream_shapes(text: str) -> dict:
    """A server-sent event stream's chunks by kind (opening, token, last token, usage), the shape of each kind's
    first, and the token ids the chunks carried. (How many tokens a chunk carries is the server's pace: vLLM sends
    the tokens of several steps in one chunk when its frontend falls behind the engine.)"""
    lines = [line for line in text.splitlines() if line.startswith("data: ") and line != "data: [DONE]"]
    chunks = [json.loads(line[6:]) for line in lines]
    assert text.rstrip().endswith("data: [DONE]")
    kinds: dict = {}
    tokens = 0
    for i, chunk in enumerate(chunks):
        choices = chunk["choices"]
        kind = "usage" if not choices else "opening" if i == 0 else "last" if choices[0]["finish_reason"] else "token"
        tokens += sum(len(choice.get("token_ids") or ()) for choice in choices)
        kinds.setdefault(kind, shape(chunk))
    return {**kinds, "tokens": tokens}


def families(text: str) -> dict[str, list[str]]:
    """Every metric family's sample names and label names."""
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name: sorted({f"{s.name}{sorted(s.labels)}" for s in f.samples}) for f in
            text_string_to_metric_families(text)}  # fmt: skip


async def observe(url: str) -> dict:
    """What a client sees of one server; the same calls for both."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        plain = (await http.post("/v1/chat/completions", json=CHAT)).json()
        bare = (await http.post("/v1/chat/completions", json={"model": MODEL_NAME, "messages": MESSAGES,
                                                               "max_tokens": 2})).json()  # fmt: skip
        streamed = await http.post(
            "/v1/chat/completions", json={**CHAT, "stream": True, "stream_options": {"include_usage": True}}
        )
        too_long = await http.post("/v1/chat/completions", json={**CHAT, "max_tokens": 10**6})
        models = (await http.get("/v1/models")).json()
        metrics = (await http.get("/metrics")).text
    async with ReplicaClient(url) as client:
        completion = await client.chat(MODEL_NAME, MESSAGES, max_tokens=5, ignore_eos=True)
        engines = await client.metrics()
    return {
        "chat": shape(plain),
        "bare chat": shape(bare),
        "stream": stream_shapes(streamed.text),
        "stream_type": streamed.headers["content-type"].split(";")[0],
        "too_long": (too_long.status_code, shape(too_long.json())),
        "models": shape(models),
        "metrics": families(metrics),
        "completion": completion,
        "engines": engines,
    }


def fleet_context(fleet) -> int:
    return httpx.get(f"{fleet.urls[0]}/v1/models", timeout=30).json()["data"][0]["max_model_len"]


def test_the_simulated_replica_answers_in_the_engines_shapes(fleet, tokenizer):
    async def main():
        config = ServerConfig(model=MODEL_NAME, time_scale=0.0, engine=SimConfig(max_model_len=fleet_context(fleet)))
        async with SimServer(config, tokenizer=TemplateTokenizer(tokenizer)) as sim:
            return await observe(fleet.urls[0]), await observe(sim.url)

    real, sim = asyncio.run(main())
    for key in ("chat", "bare chat", "stream_type", "too_long", "models"):
        assert sim[key] == real[key], f"{key}:\nsim  {sim[key]}\nreal {real[key]}"
    # Every kind of chunk vLLM sent has the simulator's shape, and both streamed the five tokens; vLLM may send them
    # in fewer chunks (and then no chunk of a token before the last), the simulator sends one a chunk.
    streams = real["stream"], sim["stream"]
    assert {"opening", "last", "usage", "tokens"} <= set(streams[0]) <= set(streams[1]), streams
    for kind in streams[0]:
        assert streams[1][kind] == streams[0][kind], f"stream {kind}:\nsim  {streams[1][kind]}\nreal {streams[0][kind]}"
    assert streams[0]["tokens"] == 5 and "token" in streams[1]
    own = {name for name in sim["metrics"] if name.startswith("terminus_sim:")}  # the simulator's diagnostics
    missing = {n: labels for n, labels in sim["metrics"].items() if n not in own and real["metrics"].get(n) != labels}
    assert not missing, f"metric families the simulator exposes otherwise than vLLM: {missing}"
    read = {alias for aliases in (*_GAUGES.values(), *_COUNTERS.values()) for alias in aliases[:1]} | {_CACHE_CONFIG}
    for server in (real, sim):
        assert read <= set(server["metrics"]), read - set(server["metrics"])
    # The client reads the same fields from both.
    for c in (real["completion"], sim["completion"]):
        assert len(c.token_ids) == len(c.logprobs) == c.completion_tokens and c.prompt_token_ids
    assert real["completion"].prompt_token_ids == sim["completion"].prompt_token_ids  # one chat template
    assert list(real["engines"]) == list(sim["engines"]) == ["0"]
    assert real["engines"]["0"].block_size and sim["engines"]["0"].block_size


async def at_the_boundary(url: str, context: int) -> dict:
    """What a server answers to prompts of the context less one token, the context, and one and nine tokens over it
    (a user message of filler words, one token each, sized by the server's own /tokenize), with and without a
    max_tokens; and the shape of its /tokenize."""
    answers: dict = {}
    async with httpx.AsyncClient(base_url=url, timeout=60) as http, ReplicaClient(url) as client:
        base = await client.prompt_tokens(MODEL_NAME, [{"role": "user", "content": "a"}])
        for n in (context - 1, context, context + 1, context + 9):
            messages = [{"role": "user", "content": "a" + " a" * (n - base)}]
            assert await client.prompt_tokens(MODEL_NAME, messages) == n
            for asked in ({"max_tokens": 4}, {}):
                body = {"model": MODEL_NAME, "messages": messages, "ignore_eos": True, **asked}
                response = await http.post("/v1/chat/completions", json=body)
                reply = response.json()
                key = f"{n - context:+d} {asked}"
                if response.status_code == 200:
                    answers[key] = (200, reply["choices"][0]["finish_reason"], reply["usage"]["completion_tokens"])
                else:
                    answers[key] = (response.status_code, reply["error"])
        tokenized = (await http.post("/tokenize", json={"model": MODEL_NAME, "messages": messages})).json()
    answers["tokenize"] = shape(tokenized)
    return answers


def test_the_simulated_replica_answers_at_the_contexts_boundary_as_vllm_does(small_fleet, tokenizer):
    """Word for word, since the client reads the words: the last token granted, "max_tokens must be at least 1, got
    0" for a prompt of exactly the context, the context error with vLLM's capped count beyond it."""
    context = fleet_context(small_fleet)

    async def main():
        config = ServerConfig(model=MODEL_NAME, time_scale=0.0, engine=SimConfig(max_model_len=context))
        async with SimServer(config, tokenizer=TemplateTokenizer(tokenizer)) as sim:
            return await at_the_boundary(small_fleet.urls[0], context), await at_the_boundary(sim.url, context)

    real, sim = asyncio.run(main())
    assert sim == real
    assert real["-1 {'max_tokens': 4}"] == (200, "length", 1)
    assert real["+0 {'max_tokens': 4}"][1]["message"].startswith("max_tokens must be at least 1, got 0.")
