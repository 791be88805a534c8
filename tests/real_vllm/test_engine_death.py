"""A request that kills a real vLLM CPU engine, and what the package does about it.

vLLM's CPU build crashes its engine on a request with a per-request ``seed`` whose prefill is split over
steps: the step that computes only part of the prompt throws its sampled token away and rewinds the request's
torch generator, and a CPU generator has no offset (``RuntimeError: CPU Generator does not use offset``).
A prompt longer than the step's token budget is always split when chunked prefill is on, so such a request is a
sure way to kill an engine. ``terminus-env serve`` turns chunked prefill off on the CPU; the session ``fleet`` is
served that way, and here a seeded prompt longer than vLLM's default CPU budget (2,048 tokens) is served whole.
``small_fleet`` turns chunked prefill back on with a small budget, to show that a request which kills an engine is
never replayed on another replica, that the other replica serves on, and that the launcher starts the dead one again.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from vllm_support import MODEL_NAME, SMALL_CONTEXT, SPLIT_BUDGET, START_TIMEOUT_S, TEST_TIMEOUT_S, answers

from terminus_env.serving import EngineDied, ReplicaClient, ServingPool
from terminus_env.serving.launcher import CHUNKED_PREFILL_WARNING, WHOLE_PREFILL_NOTE

# A fleet's start and a restarted replica's return may come before a test's own work (vllm_support).
pytestmark = pytest.mark.timeout(TEST_TIMEOUT_S)
VLLM_CPU_DEFAULT_BATCHED_TOKENS = 2048  # vLLM 0.32's step budget for an API server on the CPU
POISON_WORDS = 300  # a prompt over the small fleet's step budget and inside its context (about 2.5 tokens a word)
WORDS = ["shell", "file", "write", "list", "error", "task", "output", "path", "hello", "config", "run", "test"]


def long_prompt(n_words: int, salt: int) -> list[dict]:
    text = " ".join(WORDS[(salt * 7 + i * i) % len(WORDS)] for i in range(n_words))
    return [{"role": "user", "content": text}]


def test_a_seeded_prompt_longer_than_a_step_is_served_whole_on_cpu_replicas(fleet):
    """The crash's recipe (a seed, a prompt over the default step budget, other sessions sharing the steps) against
    replicas started by `serve`: the engine prefills the prompt in one step, so the request is served and every
    replica stays up."""
    assert WHOLE_PREFILL_NOTE in fleet.lines  # what serve did about it, and said at start

    async def main():
        async with ServingPool(fleet.urls, MODEL_NAME, policy="requests") as pool:

            async def session(i: int, seed: int | None, words: int):
                async with pool.session(f"seeded-{i}"):
                    return await pool.chat(f"seeded-{i}", long_prompt(words, i), max_tokens=8, temperature=1.0,
                                           seed=seed)  # fmt: skip

            return await asyncio.gather(
                session(0, 5, 1000), *(session(i, None if i % 2 else i, 600) for i in range(1, 7))
            )

    done = asyncio.run(main())
    assert done[0].prompt_tokens > VLLM_CPU_DEFAULT_BATCHED_TOKENS  # would have been split under vLLM's defaults
    assert all(c.completion_tokens == 8 for c in done)
    assert all(answers(url) for url in fleet.urls)


def test_a_request_that_kills_an_engine_is_not_replayed_and_the_fleet_serves_on(small_fleet, tokenizer):
    fleet = small_fleet
    assert CHUNKED_PREFILL_WARNING in fleet.launcher_log()  # serve warned that this fleet can be crashed
    poison = long_prompt(POISON_WORDS, 1)
    length = len(tokenizer.apply_chat_template(poison, add_generation_prompt=True, tokenize=True, return_dict=True)[
        "input_ids"])  # fmt: skip
    assert SPLIT_BUDGET < length < SMALL_CONTEXT - 4  # prefilled in parts, and served
    launcher_seen = len(fleet.launcher_log())
    replica_seen = [len((fleet.log_dir / f"replica-{i}.log").read_text()) for i in range(len(fleet.urls))]

    async def main():
        async with ServingPool(fleet.urls, MODEL_NAME, policy="requests", scrape_interval_s=0.5) as pool:
            async with pool.session("poison"):
                first = await pool.chat("poison", [{"role": "user", "content": "hello"}], max_tokens=4)
                home = first.replica
                other = next(url for url in fleet.urls if url != home)
                async with ReplicaClient(other) as client:
                    before = (await client.metrics())["0"].prompt_tokens_total
                started = time.monotonic()
                with pytest.raises(EngineDied) as died:
                    await pool.chat("poison", poison, max_tokens=4, temperature=1.0, seed=5)
                died_after_s = time.monotonic() - started
                async with ReplicaClient(other) as client:
                    after = (await client.metrics())["0"].prompt_tokens_total
            async with pool.session("innocent"):
                served_on = (await pool.chat("innocent", long_prompt(50, 2), max_tokens=4)).replica
            # The launcher starts the dead replica again; the pool takes it back once it answers /health.
            deadline = time.monotonic() + START_TIMEOUT_S
            while not pool.is_up(home) and time.monotonic() < deadline:
                await asyncio.sleep(1)
            back = pool.is_up(home)
            return died.value, home, other, before, after, served_on, back, pool.failovers, died_after_s

    died, home, other, before, after, served_on, back, failovers, died_after_s = asyncio.run(main())
    print(f"\nthe engine died {died_after_s:.1f}s after the request; {died}")
    message = str(died)
    assert f"replica {home}'s engine died" in message and "session 'poison'" in message
    assert "not sent to another replica" in message and "'seed': 5" in message
    assert after == before and failovers == 0  # the poison never reached the other replica
    assert served_on == other and answers(other)  # which serves on
    index = fleet.urls.index(home)
    home_log = (fleet.log_dir / f"replica-{index}.log").read_text()[replica_seen[index] :]
    assert "CPU Generator does not use offset" in home_log
    assert "; starting it again (1 of 3)" in fleet.launcher_log()[launcher_seen:]
    assert back  # and the dead replica is back in the pool
