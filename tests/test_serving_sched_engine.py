"""SimReplica on tiny configurations, with numbers worked out by hand."""

from __future__ import annotations

import pytest

from terminus_env.serving.sim.engine import (
    ContextTooLong,
    KVBlocks,
    SimConfig,
    SimReplica,
    SimRequest,
    UnknownRequest,
)

# 9 blocks of 4 tokens: block 0 is vLLM's null block, so 8 are usable (32 tokens).
TINY = SimConfig(num_gpu_blocks=9, block_size=4, max_num_seqs=8, max_model_len=32, max_num_batched_tokens=64)


def drain(replica: SimReplica) -> list[float]:
    steps = []
    while replica.has_work():
        steps.append(replica.step())
    return steps


def step_time(cfg: SimConfig, tokens: int, seqs: int, context: int) -> float:
    """One sequence's step: ``tokens`` new tokens ending at position ``context``."""
    pairs = tokens * (context - tokens) + tokens * (tokens + 1) // 2
    return (
        cfg.step_base_s + cfg.step_per_token_s * tokens + cfg.step_per_seq_s * seqs
        + cfg.step_per_context_token_s * context + cfg.step_per_token_pair_s * pairs
    )


def test_one_request_allocates_per_block_and_generates_one_token_per_step() -> None:
    replica = SimReplica(TINY)
    replica.submit(SimRequest("a", tuple(range(10)), max_tokens=8, output_len=3))
    first = replica.step()  # prefill 10 tokens -> 3 blocks, first output token
    assert first == pytest.approx(step_time(TINY, tokens=10, seqs=1, context=10))
    assert replica.kv_blocks() == KVBlocks(usable=8, free=5, evictable_cached=0, active=3)
    assert replica.metrics().kv_cache_usage == pytest.approx(3 / 8)
    rest = drain(replica)  # two decode steps; 12 computed tokens still fit 3 blocks
    assert rest == pytest.approx([step_time(TINY, 1, 1, 11), step_time(TINY, 1, 1, 12)])
    [done] = replica.pop_finished()
    assert (done.output_tokens, done.finish_reason, done.preemptions, done.cached_prompt_tokens) == (3, "stop", 0, 0)
    assert done.ttft_s == pytest.approx(first)
    assert done.e2e_s == pytest.approx(first + sum(rest))
    assert done.queued_s == 0.0
    assert len(done.output_token_ids) == 3
    # 12 computed tokens = 3 full blocks, all kept in the prefix cache; vLLM counts them as free.
    assert replica.kv_blocks() == KVBlocks(usable=8, free=5, evictable_cached=3, active=0)
    m = replica.metrics()
    assert (m.kv_cache_usage, m.prompt_tokens_total, m.generation_tokens_total) == (0.0, 10, 3)
    assert replica.now == pytest.approx(done.e2e_s)


def test_max_tokens_and_max_model_len_end_with_length() -> None:
    replica = SimReplica(TINY)
    replica.submit(SimRequest("cut", (1, 2, 3), max_tokens=2, output_len=10))
    replica.submit(SimRequest("long", tuple(range(30)), max_tokens=10, output_len=10))
    drain(replica)
    done = {f.request_id: f for f in replica.pop_finished()}
    assert (done["cut"].output_tokens, done["cut"].finish_reason) == (2, "length")
    assert (done["long"].output_tokens, done["long"].finish_reason) == (2, "length")  # 30 + 2 = max_model_len


def test_next_turn_reuses_the_previous_turns_blocks() -> None:
    replica = SimReplica(TINY)
    prompt = tuple(range(10))
    replica.submit(SimRequest("t0", prompt, max_tokens=8, output_len=3))
    drain(replica)
    [t0] = replica.pop_finished()
    follow_up = prompt + t0.output_token_ids + (7, 7)  # 15 tokens; blocks 0-2 are cached (12 tokens)
    replica.submit(SimRequest("t1", follow_up, max_tokens=8, output_len=1))
    drain(replica)
    [t1] = replica.pop_finished()
    assert t1.cached_prompt_tokens == 12
    m = replica.metrics()
    assert (m.prefix_cache_queries_total, m.prefix_cache_hits_total) == (10 + 15, 12)
    assert replica.stats().prefill_tokens == 10 + 3


def test_group_sibling_hits_the_shared_prompt_but_leaves_one_token_to_compute() -> None:
    replica = SimReplica(TINY)
    prompt = tuple(range(8))  # exactly two blocks
    replica.submit(SimRequest("g0", prompt, max_tokens=4, output_len=1))
    drain(replica)
    replica.submit(SimRequest("g1", prompt, max_tokens=4, output_len=1))
    drain(replica)
    sibling = {f.request_id: f for f in replica.pop_finished()}["g1"]
    assert sibling.cached_prompt_tokens == 4  # the last block is recomputed so the model has logits


def test_siblings_scheduled_together_do_not_hit_each_other() -> None:
    replica = SimReplica(TINY)
    replica.submit(SimRequest("g0", tuple(range(9)), max_tokens=4, output_len=1))
    replica.submit(SimRequest("g1", tuple(range(9)), max_tokens=4, output_len=1))
    drain(replica)
    assert replica.metrics().prefix_cache_hits_total == 0


def test_lru_eviction_takes_never_used_blocks_first_then_a_requests_tail() -> None:
    replica = SimReplica(TINY)
    prompt = tuple(range(12))
    replica.submit(SimRequest("a", prompt, max_tokens=1, output_len=1))  # 12 computed = 3 cached blocks
    drain(replica)
    assert replica.kv_blocks().evictable_cached == 3
    # 21 tokens need 6 blocks: the 5 never-used ones, then the cached block freed last-in-first-out (a's tail).
    replica.submit(SimRequest("other", tuple(range(100, 121)), max_tokens=2, output_len=2))
    replica.step()
    assert replica.kv_blocks() == KVBlocks(usable=8, free=0, evictable_cached=2, active=6)
    drain(replica)
    replica.pop_finished()
    replica.submit(SimRequest("a2", prompt + (5,), max_tokens=1, output_len=1))
    drain(replica)
    [a2] = replica.pop_finished()
    assert a2.cached_prompt_tokens == 8  # a's first two blocks survived, its third was evicted


def test_recompute_preemption_evicts_the_newest_request_and_requeues_it_first() -> None:
    cfg = SimConfig(num_gpu_blocks=9, block_size=4, max_num_seqs=8, max_model_len=32, enable_prefix_caching=False)
    replica = SimReplica(cfg)
    replica.submit(SimRequest("old", tuple(range(12)), max_tokens=20, output_len=8))
    replica.submit(SimRequest("new", tuple(range(100, 112)), max_tokens=20, output_len=8))
    for _ in range(5):  # both grow to 16 computed tokens = 4 blocks each: the pool is full
        replica.step()
    assert replica.kv_blocks().active == 8
    replica.step()  # "old" needs a 5th block: "new" is preempted and its 16 tokens freed
    m = replica.metrics()
    assert (m.num_requests_running, m.num_requests_waiting, m.num_preemptions_total) == (1, 1, 1)
    drain(replica)
    done = {f.request_id: f for f in replica.pop_finished()}
    assert (done["old"].preemptions, done["new"].preemptions) == (0, 1)
    assert done["new"].output_tokens == 8  # generated tokens survive; only their KV is recomputed
    stats = replica.stats()
    assert (stats.preemptions, stats.recomputed_tokens, stats.generation_tokens) == (1, 16, 16)
    assert replica.kv_blocks().free == 8


def test_chunked_prefill_spends_the_token_budget_over_several_steps() -> None:
    cfg = SimConfig(num_gpu_blocks=9, block_size=4, max_model_len=32, max_num_batched_tokens=8)
    replica = SimReplica(cfg)
    replica.submit(SimRequest("p", tuple(range(20)), max_tokens=1, output_len=1))
    steps = drain(replica)
    assert steps == pytest.approx([step_time(cfg, 8, 1, 8), step_time(cfg, 8, 1, 16), step_time(cfg, 4, 1, 20)])
    [done] = replica.pop_finished()
    assert done.ttft_s == pytest.approx(sum(steps))


def test_without_chunked_prefill_a_prompt_waits_until_its_whole_prefill_fits_the_step() -> None:
    """vLLM's CPU replicas: a waiting request is never split; one that does not fit what decodes left of the
    budget waits, and the queue behind it too (FCFS), until a step has room for all of it."""
    cfg = SimConfig(num_gpu_blocks=17, block_size=4, max_model_len=32, max_num_batched_tokens=32,
                    enable_chunked_prefill=False)
    replica = SimReplica(cfg)
    replica.submit(SimRequest("long", tuple(range(32 - 1)), max_tokens=1, output_len=1))
    replica.submit(SimRequest("short", (100, 101), max_tokens=1, output_len=1))
    first = replica.step()  # 31 tokens fit the 32-token budget whole; "short" needs 2 more than the 1 left
    assert first == pytest.approx(step_time(cfg, 31, 1, 31))
    assert (replica.metrics().num_requests_running, replica.metrics().num_requests_waiting) == (0, 1)
    drain(replica)
    assert {f.request_id for f in replica.pop_finished()} == {"long", "short"}
    chunked = SimReplica(SimConfig(num_gpu_blocks=17, block_size=4, max_model_len=32, max_num_batched_tokens=32))
    chunked.submit(SimRequest("a", tuple(range(30)), max_tokens=1, output_len=1))
    chunked.submit(SimRequest("b", (100, 101, 102), max_tokens=1, output_len=1))
    chunked.step()  # with chunking, "b" takes the 2 tokens left and finishes its prefill next step
    assert chunked.metrics().num_requests_running == 1


def test_without_chunked_prefill_the_step_budget_must_hold_a_whole_context() -> None:
    with pytest.raises(ValueError, match="chunked prefill off"):
        SimConfig(num_gpu_blocks=17, block_size=4, max_model_len=32, max_num_batched_tokens=16,
                  enable_chunked_prefill=False)


def test_a_resumed_requests_lookup_is_kept_out_of_the_prefix_cache_counters() -> None:
    """vLLM 0.32 records a preempted request's lookup apart (``preempted_queries``), not in vllm:prefix_cache_*."""
    cfg = SimConfig(num_gpu_blocks=9, block_size=4, max_num_seqs=8, max_model_len=32)
    replica = SimReplica(cfg)
    replica.submit(SimRequest("old", tuple(range(12)), max_tokens=20, output_len=8))
    replica.submit(SimRequest("new", tuple(range(100, 112)), max_tokens=20, output_len=8))
    drain(replica)
    assert replica.stats().preemptions == 1
    m = replica.metrics()
    assert (m.prefix_cache_queries_total, m.prefix_cache_hits_total) == (24, 0)  # the two first admissions only


def test_max_num_seqs_keeps_the_rest_waiting() -> None:
    cfg = SimConfig(num_gpu_blocks=9, block_size=4, max_num_seqs=2, max_model_len=32)
    replica = SimReplica(cfg)
    for i in range(3):
        replica.submit(SimRequest(f"r{i}", (i, i + 1), max_tokens=4, output_len=4))
    replica.step()
    m = replica.metrics()
    assert (m.num_requests_running, m.num_requests_waiting) == (2, 1)
    drain(replica)
    assert len(replica.pop_finished()) == 3


def test_bad_input_is_refused_and_abort_frees_blocks() -> None:
    replica = SimReplica(TINY)
    with pytest.raises(ContextTooLong, match="max_model_len"):
        replica.submit(SimRequest("big", tuple(range(32)), max_tokens=1, output_len=1))
    with pytest.raises(ValueError, match="empty prompt"):
        replica.submit(SimRequest("empty", (), max_tokens=1, output_len=1))
    replica.submit(SimRequest("x", (1, 2, 3, 4, 5), max_tokens=8, output_len=8))
    with pytest.raises(ValueError, match="already queued"):
        replica.submit(SimRequest("x", (1,), max_tokens=1, output_len=1))
    replica.step()
    replica.abort("x")
    assert not replica.has_work()
    assert replica.kv_blocks().active == 0
    with pytest.raises(UnknownRequest):
        replica.abort("x")
    assert replica.step() == 0.0


def test_config_refuses_a_context_larger_than_the_pool() -> None:
    with pytest.raises(ValueError, match="does not fit the KV pool"):
        SimConfig(num_gpu_blocks=5, block_size=4, max_model_len=32)


def test_idle_clock_only_moves_forward_and_not_while_busy() -> None:
    replica = SimReplica(TINY)
    replica.advance_to(5.0)
    replica.advance_to(3.0)
    assert replica.now == 5.0
    replica.submit(SimRequest("q", (1, 2), max_tokens=1, output_len=1))
    with pytest.raises(RuntimeError, match="busy"):
        replica.advance_to(6.0)
    replica.step()
    [done] = replica.pop_finished()
    assert done.e2e_s == pytest.approx(replica.now - 5.0)


def test_arrival_inside_a_step_counts_its_queueing_time() -> None:
    replica = SimReplica(TINY)
    replica.submit(SimRequest("a", (1, 2, 3), max_tokens=2, output_len=2))
    dt = replica.step()
    replica.submit(SimRequest("b", (4, 5, 6), max_tokens=1, output_len=1), arrival_s=dt / 2)
    drain(replica)
    done = {f.request_id: f for f in replica.pop_finished()}
    assert done["b"].queued_s == pytest.approx(dt / 2)


def test_scripted_output_ids_are_generated_and_cached_for_the_next_turn() -> None:
    replica = SimReplica(TINY)
    prompt = tuple(range(10))
    replica.submit(SimRequest("t0", prompt, max_tokens=8, output_len=6, output_token_ids=(90, 91, 92, 93, 94, 95)))
    drain(replica)
    [t0] = replica.pop_finished()
    assert t0.output_token_ids == (90, 91, 92, 93, 94, 95)
    # 15 computed tokens: blocks 0-2 are full and cached; the caller's next prompt reuses them.
    replica.submit(SimRequest("t1", prompt + (90, 91, 92, 93, 94, 95, 1), max_tokens=1, output_len=1))
    drain(replica)
    [t1] = replica.pop_finished()
    assert t1.cached_prompt_tokens == 12
