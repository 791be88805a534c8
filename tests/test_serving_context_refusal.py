"""An engine's refusal at the context's boundary is the context's end, in any engine's words, and by measure where the
words are unknown: never a plain serving error, which would mask the episode as the infrastructure's."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from terminus_env.serving.client import ContextLengthExceeded, ReplicaClient, RequestRefused
from terminus_env.serving.context_refusal import context_exhausted, exhausted_by_measure, room_left
from terminus_env.serving.sim.context_rules import Refusal, granted_tokens
from terminus_env.serving.sim.engine import SimConfig
from terminus_env.serving.sim.server import ServerConfig, SimServer

# Each engine's words at the boundary, from its source (vLLM 0.32 and older releases, SGLang's TokenizerManager).
EXHAUSTED = {
    "vllm 0.32, prompt of exactly the context": "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)",
    "vllm 0.32, prompt over the context": (
        "This model's maximum context length is 1024 tokens. However, your prompt contains at least 1025 input "
        "tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input "
        "prompt. (parameter=input_tokens, value=1025)"
    ),
    "vllm before 0.10, prompt and reply over the context": (
        "This model's maximum context length is 1024 tokens. However, you requested 1030 tokens (1024 in the "
        "messages, 6 in the completion). Please reduce the length of the messages or completion."
    ),
    "vllm get_max_tokens": "Input length (1030) exceeds model's maximum context length (1024).",
    "vllm, max_completion_tokens": "max_completion_tokens must be at least 1, got 0.",
    "sglang, input": "The input (1024 tokens) is longer than the model's context length (1024 tokens).",
    "sglang, total": (
        "Requested token count exceeds the model's maximum context length of 1024 tokens. You requested a total of "
        "1030 tokens: 1000 tokens from the input messages and 30 tokens for the completion. Please reduce the number "
        "of tokens in the input messages or the completion to fit within the limit."
    ),
}
NOT_THE_CONTEXT = {
    "max_tokens above the model": "max_tokens=2048 cannot be greater than max_model_len=1024. Please request fewer "
    "output tokens. (parameter=max_tokens, value=2048)",
    "a bad temperature": "temperature must be non-negative, got -1.0.",
    "an unknown model": "The model `other` does not exist.",
    "max_tokens of 10": "max_tokens must be at least 1, got 10.",
    "a negative max_tokens": "max_tokens must be at least 1, got -3.",
}


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=60))


@pytest.mark.parametrize("engine", EXHAUSTED)
def test_every_engines_words_for_an_exhausted_context_are_the_contexts_end(engine):
    assert context_exhausted(EXHAUSTED[engine], asked=1024)


@pytest.mark.parametrize("case", NOT_THE_CONTEXT)
def test_other_refusals_are_not(case):
    assert not context_exhausted(NOT_THE_CONTEXT[case], asked=1024)


def test_no_room_counts_only_when_a_token_was_asked_for():
    """"got 0" after asking for 0 is the caller's error; after asking for more, the engine cut it to the room left."""
    words = EXHAUSTED["vllm 0.32, prompt of exactly the context"]
    assert context_exhausted(words, asked=1) and not context_exhausted(words, asked=0)


def test_room_left_follows_each_engines_rule():
    """vLLM allows prompt + reply == context, SGLang refuses it; neither leaves room when the prompt fills it."""
    old_vllm = EXHAUSTED["vllm before 0.10, prompt and reply over the context"]
    assert room_left(old_vllm.replace("1024 in the", "1000 in the"), asked=30) == 24
    assert room_left(old_vllm, asked=30) is None  # the prompt is the whole context
    assert room_left(EXHAUSTED["sglang, total"], asked=30) == 23
    sglang_full = EXHAUSTED["sglang, total"].replace("1000 tokens from", "1023 tokens from")
    assert room_left(sglang_full, asked=30) is None
    assert room_left(EXHAUSTED["vllm 0.32, prompt over the context"], asked=30) is None  # no counts to go by


def test_the_measure_decides_at_the_boundary():
    assert exhausted_by_measure(1024, 1024) and exhausted_by_measure(1025, 1024)
    assert not exhausted_by_measure(1023, 1024)


def test_the_simulators_rules_at_the_boundary_are_vllms():
    """The simulated replica grants and refuses as vLLM 0.32 does, in its order."""
    assert granted_tokens(1023, 16384 // 16, 1024) == 1
    assert granted_tokens(1023, None, 1024) == 1
    exact = granted_tokens(1024, 512, 1024)
    assert exact == Refusal("max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)", "max_tokens")
    over = granted_tokens(1025, 512, 1024)
    assert isinstance(over, Refusal) and over.param == "input_tokens" and "at least 1025 input tokens" in over.message
    far = granted_tokens(5000, 512, 1024)
    assert isinstance(far, Refusal) and far.message == over.message  # vLLM tokenizes no further than context + 1
    first = granted_tokens(5000, 2048, 1024)  # max_tokens above the model is refused before the prompt is read
    assert isinstance(first, Refusal) and first.param == "max_tokens" and "cannot be greater" in first.message


class Foreign:
    """An engine whose refusal at the boundary is in words no rule knows, with vLLM's /tokenize (or without it)."""

    def __init__(self, prompt_tokens: int, tokenize: bool = True) -> None:
        self.prompt_tokens = prompt_tokens
        self.tokenize = tokenize
        self.asked: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.asked.append(request.url.path)
        if request.url.path == "/tokenize" and self.tokenize:
            assert json.loads(request.content)["add_generation_prompt"] is True
            return httpx.Response(200, json={"count": self.prompt_tokens, "max_model_len": 100, "tokens": []})
        if request.url.path == "/v1/chat/completions":
            return httpx.Response(400, json={"error": {"message": "request rejected: budget", "code": 400}})
        return httpx.Response(404, json={"detail": "Not Found"})


@pytest.mark.parametrize("measured", [100, 101])
def test_an_unknown_refusal_of_a_prompt_that_measures_the_whole_context_is_its_end(measured):
    engine = Foreign(measured)

    async def main():
        async with ReplicaClient("http://x", transport=httpx.MockTransport(engine)) as client:
            with pytest.raises(ContextLengthExceeded) as exhausted:
                await client.chat("m", [{"role": "user", "content": "hi"}], max_tokens=10, context_window=100)
        return exhausted.value

    exhausted = run(main())
    assert f"the prompt measures {measured} tokens of the 100-token context" in str(exhausted)
    assert exhausted.reason == "request rejected: budget"
    assert engine.asked == ["/v1/chat/completions", "/tokenize"]


@pytest.mark.parametrize(
    ("engine", "window"),
    [(Foreign(99), 100), (Foreign(100, tokenize=False), 100), (Foreign(100), None)],
    ids=["room left", "no /tokenize", "context unknown"],
)
def test_an_unknown_refusal_stands_where_the_prompt_leaves_room_or_cannot_be_measured(engine, window):
    """The refusal stays the serving error it is: the pool cannot prove the context was exhausted."""

    async def main():
        async with ReplicaClient("http://x", transport=httpx.MockTransport(engine)) as client:
            with pytest.raises(RequestRefused) as refused:
                await client.chat("m", [{"role": "user", "content": "hi"}], max_tokens=10, context_window=window)
        return refused.value

    refused = run(main())
    assert not isinstance(refused, ContextLengthExceeded) and refused.status == 400


def test_sglang_is_asked_again_for_strictly_less_than_the_room():
    asked = []

    def sglang(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        asked.append(body["max_tokens"])
        if body["max_tokens"] + 60 >= 100:
            message = (f"Requested token count exceeds the model's maximum context length of 100 tokens. You requested "
                       f"a total of {60 + body['max_tokens']} tokens: 60 tokens from the input messages and "
                       f"{body['max_tokens']} tokens for the completion.")  # fmt: skip
            return httpx.Response(400, json={"object": "error", "message": message, "code": 400})
        return httpx.Response(200, json={
            "choices": [{"message": {"content": "ok"}, "finish_reason": "length", "logprobs": None}],
            "usage": {"prompt_tokens": 60, "completion_tokens": body["max_tokens"]}})  # fmt: skip

    async def main():
        async with ReplicaClient("http://x", transport=httpx.MockTransport(sglang)) as client:
            return await client.chat("m", [{"role": "user", "content": "hi"}], max_tokens=100)

    done = run(main())
    assert asked == [100, 39] and done.completion_tokens == 39


def test_the_pool_ends_a_conversation_that_fills_the_simulated_context_to_its_last_token():
    """Through the pool, against the simulated replica: one token short, a one-token reply that fills the context;
    exactly full, the context's end (vLLM's "got 0" refusal); the replica stays up for the next session."""
    config = ServerConfig(model="m", time_scale=0.0, engine=SimConfig(num_gpu_blocks=64, max_model_len=100))

    def words(n: int) -> list[dict]:
        return [{"role": "user", "content": "word " * (n - 5)}]

    async def main():
        from terminus_env.serving import ServingPool

        async with SimServer(config) as server, ServingPool([server.url], "m", scrape_interval_s=0.05) as pool:
            async with pool.session("short"):
                short = await pool.chat("short", words(99), max_tokens=16384, ignore_eos=True)
            async with pool.session("full"):
                with pytest.raises(ContextLengthExceeded) as full:
                    await pool.chat("full", words(100), max_tokens=16384)
            return short, full.value, pool.is_up(server.url)

    short, full, up = run(main())
    assert (short.prompt_tokens, short.completion_tokens, short.finish_reason, short.max_model_len) == (
        99, 1, "length", 100
    )  # fmt: skip
    assert full.reason.startswith("max_tokens must be at least 1, got 0") and up
