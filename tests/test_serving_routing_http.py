"""The HTTP routing benchmark's machinery: the workload as chat, real router processes, and cleanup."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import routing_http as bench
from routing_lab.chat import chat_rollouts, twin_plans, write_replies
from routing_lab.workload import make_workload
from serving_support import pid_alive

from terminus_env.serving.sim.replies import ScriptedReplies
from terminus_env.serving.sim.tokenizer import encode_chat

BENCH = Path(__file__).resolve().parent.parent / "bench"


def test_the_chat_form_and_its_twin_are_the_same_tokens(tmp_path: Path) -> None:
    setup = bench.quick_setup()
    plans = make_workload(setup.workload)
    chats = chat_rollouts(plans, setup.workload.system_prompt_tokens)
    twins = twin_plans(chats)
    replies = ScriptedReplies.from_file(write_replies(chats, tmp_path / "replies.jsonl"))
    for plan, chat, twin in zip(plans[0], chats[0], twins[0]):
        messages = chat.first_messages()
        assert twin.prompt == tuple(encode_chat(messages))
        # Two more tokens than the plan's prompt: the chat framing and the rollout's marker.
        assert len(twin.prompt) > len(plan.prompt) and [t.output_len for t in twin.turns] == [
            t.output_len for t in plan.turns
        ]
        prompt = list(twin.prompt)
        for i, turn in enumerate(chat.turns):
            assert replies(messages) == turn.reply  # the replicas answer each turn as planned
            assert len(prompt) == len(encode_chat(messages))
            messages += [{"role": "assistant", "content": turn.reply}, {"role": "user", "content": turn.tool}]
            prompt += [*twin.turns[i].output_token_ids, *twin.turns[i].tool_tokens]
            if turn.tool:
                assert prompt == encode_chat(messages)  # the next prompt, token for token


def test_a_tiny_workload_through_a_real_router_and_through_the_pool(tmp_path: Path) -> None:
    """vllm-router (from PyPI) in front of simulated replicas, against ServingPool: every rollout served,
    the same tokens both ways and in virtual time, and the router's sticky policy kept every turn home."""
    setup = dataclasses.replace(bench.quick_setup(), time_scale=0.25)
    chats, twins = bench.workload(setup)
    replies = write_replies(chats, tmp_path / "replies.jsonl")
    sticky = bench.Row("vllm-router sticky_least_loaded", "fixed",
                       router=bench.RouterSpec("vllm-router", "sticky_least_loaded"))
    ours = bench.rows(["ours:"])[0]
    virtual = bench.run_twin(ours.pool, setup, twins)
    results = {row.label: bench.run_row(row, setup, chats, twins, replies, tmp_path)[0] for row in (ours, sticky)}
    expected = {(p.rollout_id, 0): len(p.prompt) for batch in twins for p in batch}
    for label, r in results.items():
        assert (r.requests, r.output_tokens) == (virtual.requests, virtual.output_tokens), label
        assert r.replicas.generation_tokens == r.output_tokens, label  # the replicas counted what the client saw
        assert {k: v for k, v in r.prompt_tokens.items() if k[1] == 0} == expected, label
        assert len(r.batch_spans_s) == 2 and r.makespan_s > 0 and r.replicas.prefix_hits > 0, label
    assert results[sticky.label].stay_share == 1.0
    assert results[sticky.label].followup_turns == virtual.followup_turns


def test_server_processes_die_with_a_killed_benchmark(tmp_path: Path) -> None:
    script = tmp_path / "hold.py"
    script.write_text(
        "import sys, time\n"
        f"sys.path.insert(0, {str(BENCH)!r})\n"
        "from pathlib import Path\n"
        "from routing_lab.processes import Processes\n"
        "from terminus_env.serving.sim.engine import SimConfig\n"
        "procs = Processes(Path(sys.argv[1]))\n"
        "procs.replicas(2, SimConfig(num_gpu_blocks=64, max_model_len=512), 0.0, Path(sys.argv[2]), 'm')\n"
        "print(' '.join(str(p.pid) for p in procs._procs), flush=True)\n"
        "time.sleep(600)\n"
    )
    replies = tmp_path / "replies.jsonl"
    replies.write_text(json.dumps({"reply": "ok"}) + "\n")
    holder = subprocess.Popen([sys.executable, str(script), str(tmp_path), str(replies)], stdout=subprocess.PIPE,
                              text=True)
    try:
        pids = [int(p) for p in holder.stdout.readline().split()]
        assert len(pids) == 2 and all(pid_alive(p) for p in pids)
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(pid_alive(p) for p in pids)
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.stdout.close()


def _row(label: str, cap: str, makespan: float, preemptions: float = 0.0) -> dict:
    return {"label": label, "cap": cap, "limit": "38", "added_latency_ms": None, "makespan_s": makespan,
            "requests": 1000, "output_tokens": 100_000, "followup_turns": 900, "stayed_turns": 900,
            "replicas": {"preemptions": preemptions, "prefix_queries": 10.0, "prefix_hits": 9.0, "max_lag_s": 0.1}}


def test_the_report_judges_the_means_of_several_runs(tmp_path: Path) -> None:
    ours, reference = bench.rows([])[0].label, bench.rows([])[2].label
    cache_aware, sticky = "vllm-router cache_aware", "vllm-router sticky_least_loaded"
    runs = [
        [_row(ours, "adaptive", 400, 2), _row(reference, "adaptive", 380), _row(cache_aware, "fixed", 480),
         _row(sticky, "fixed", 390)],
        [_row(ours, "adaptive", 500, 4), _row(reference, "adaptive", 450), _row(cache_aware, "fixed", 520),
         _row(sticky, "fixed", 530)],
    ]
    files = []
    for seed, rows in enumerate(runs):
        files.append(tmp_path / f"run{seed}.json")
        files[-1].write_text(json.dumps({"setup": {"workload": {"seed": seed}}, "latency_ms": {"ours": 0.1},
                                         "rows": rows}))
    out = bench.report(files)
    assert f"{ours:<44}adaptive      2        0,1      450.0     1.08" in out  # (400/380 + 500/450) / 2
    assert "[met] ours >= 1.10x faster than vllm-router cache_aware as deployed (its better cap): 1.11x" in out
    assert "[met] ours faster than every router policy and cap: 1.02x" in out  # sticky: (390 + 530) / 2 = 460
    assert "[met] ours within 1.10x of the clairvoyant-order makespan: 1.08x" in out
    assert "[met] ours: preemptions <= 1% of requests: 0.30%" in out

    rerun = tmp_path / "rerun1.json"  # seed 1's sticky row again: it replaces that row, the rest of seed 1 stays
    rerun.write_text(json.dumps({"setup": {"workload": {"seed": 1}}, "rows": [_row(sticky, "fixed", 410)]}))
    out = bench.report([*files, rerun])
    assert f"{sticky:<44}fixed         2        0,1      400.0     0.97" in out  # (390/380 + 410/450) / 2
    assert "[NOT met] ours faster than every router policy and cap: 0.89x" in out


def test_the_twins_reproduce_the_benchmark_s_own_twin_and_jitter_only_tool_waits() -> None:
    import routing_twins as twins

    setup = bench.quick_setup()
    _, plans = bench.workload(setup)
    ours = twins.TWINS[0]
    exact, _ = twins.run(ours, setup, 0.05, 0)  # draw 0 is the plan itself
    assert exact == bench.run_twin(bench.PoolSpec(), setup, plans).makespan_s

    moved = twins.jittered(plans, 0.05, 3)
    pairs = [(a, b) for pa, pb in zip(plans, moved) for ra, rb in zip(pa, pb) for a, b in zip(ra.turns, rb.turns)]
    assert any(a.tool_wait_s != b.tool_wait_s for a, b in pairs)
    for a, b in pairs:
        assert dataclasses.replace(b, tool_wait_s=a.tool_wait_s) == a  # tokens and lengths untouched
        assert 0.95 * a.tool_wait_s <= b.tool_wait_s <= 1.05 * a.tool_wait_s
    assert twins.jittered(plans, 0.05, 3) == moved  # a draw is reproducible

    router_twin = next(t for t in twins.TWINS if t.policy == "requests")
    makespan, preempted = twins.run(router_twin, setup, 0.05, 1)
    assert makespan > 0 and 0 <= preempted <= 1


def test_vllm_router_places_by_live_sessions_once_told_that_sessions_ended(tmp_path: Path) -> None:
    """As deployed, the client ends each session with ``/finish_session``: ``sticky_least_loaded`` then sends a new
    session to the replica a finished one freed (without the call it counts every session ever given, and two
    replicas with one session each would tie, so each check below would hold by chance half the time)."""
    import asyncio

    from routing_lab.http_run import RouterEndpoint
    from routing_lab.processes import Processes

    setup = bench.quick_setup()
    chats, _ = bench.workload(setup)
    rollouts = [ro for batch in chats for ro in batch]
    spec = bench.RouterSpec("vllm-router", "sticky_least_loaded")
    assert spec.finishes_sessions

    async def first_turn(endpoint: RouterEndpoint, ro) -> str:  # type: ignore[no-untyped-def]
        return (await endpoint.chat(ro, 0, ro.first_messages())).replica

    async def placements(url: str) -> list[tuple[str, str, str]]:
        endpoint = RouterEndpoint(url, spec.session_header, bench.MODEL, limit=8, finish_sessions=True)
        out = []
        try:
            for k in range(4):
                held, ended, new = rollouts[3 * k: 3 * k + 3]
                async with endpoint.session(held):
                    on_held = await first_turn(endpoint, held)
                    async with endpoint.session(ended):
                        on_ended = await first_turn(endpoint, ended)
                    async with endpoint.session(new):
                        out.append((on_held, on_ended, await first_turn(endpoint, new)))
        finally:
            await endpoint.aclose()
        return out

    with Processes(tmp_path) as procs:
        urls = procs.replicas(2, setup.engine, 0.0, write_replies(chats, tmp_path / "replies.jsonl"), bench.MODEL)
        seen = asyncio.run(placements(procs.router(spec, urls)))
    for on_held, on_ended, on_new in seen:
        assert on_held != on_ended and on_new == on_ended, seen
