"""Routing over real HTTP: our ServingPool against the vllm-router and sglang-router processes people deploy.

Usage: .venv/bin/python bench/routing_http.py [--replicas 4] [--steps 3] [--batch 16] [--group 8] [--seed 0]
       [--async-steps 2] [--time-scale 0.5] [--only TEXT ...] [--json FILE] [--logs DIR] [--quick]
       [--replica-url URL ... --model NAME]   # live vLLM replicas instead of simulated ones (bench/gpu_check.sh)

Needs the routers from PyPI: ``pip install -e '.[routers]'`` (never vendored). Every row serves the same
agentic RL workload as ``bench/routing.py`` (GRPO groups, heavy-tailed turns, tool waits, overlapping
steps), as chat over HTTP, on N simulated replicas started afresh for the row, each its own process,
whose scripted replies make every row send and receive the same tokens. Time runs ``--time-scale``
real seconds per simulated second; every figure is in simulated seconds. The rows:

- ours: ``ServingPool`` with ``available_kv`` placement, adaptive admission and rebalancing, and its
  strictly sticky variant;
- the clairvoyant order: the same pool admitting by each rollout's true critical path, the makespan
  the targets are measured against;
- every policy of both routers, as deployed: uncapped (the rollout side caps only at the pipeline cap)
  and behind the fixed capacity formula (the rollout side caps at ``min(pipeline, x × DP × 0.9)``).

Each row's prefix-cache hits and preemptions come from the replicas' ``/metrics``; the share of turns
that stayed on their replica from the ``x-sim-replica`` header (the pool's own record for ours); the
router's added latency from sequential requests through it and straight to a replica, on replicas at
time scale 0. Last, the fidelity check: ours and the clairvoyant order in virtual time
(``bench/routing_lab/cluster.py``) on exactly the same token streams must agree with their HTTP runs
within a few percent, and no engine may have run far behind the wall clock.

With ``--replica-url`` the rows run against live vLLM servers instead, one after the other on the same
replicas (their prefix caches are reset between rows where the server allows it, with
``VLLM_SERVER_DEV_MODE=1``). Each turn then asks for exactly its planned length (``ignore_eos``), time
is real (scale 1), and the virtual-time twin and fidelity check do not apply.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import httpx
import routing as vt
from routing_lab.chat import ChatRollout, chat_rollouts, twin_plans, write_replies
from routing_lab.cluster import Cluster, ClusterConfig, ClusterResult
from routing_lab.http_run import HttpResult, PoolEndpoint, RouterEndpoint, request_body, serve
from routing_lab.oracle import OracleAdmission
from routing_lab.processes import Processes, RouterSpec, versions
from routing_lab.workload import RolloutPlan, WorkloadConfig, make_workload

from terminus_env.serving.admission import AdaptiveAdmission, Admission, FixedAdmission
from terminus_env.serving.capacity import pipeline_concurrency_cap
from terminus_env.serving.client import ReplicaClient
from terminus_env.serving.pool import ServingPool
from terminus_env.serving.router import Router
from terminus_env.serving.scheduler import Scheduler
from terminus_env.serving.sim.engine import SimConfig
from terminus_env.serving.sim.server import REPLICA_HEADER

MODEL = "sim"
VLLM_ROUTER_POLICIES = ("cache_aware", "sticky_least_loaded", "kv_aware", "consistent_hash", "power_of_two",
                        "round_robin", "random")
SGLANG_ROUTER_POLICIES = (("cache_aware",), ("round_robin",), ("power_of_two",), ("random",),
                          ("manual",), ("manual", "--assignment-mode", "min_load"),
                          ("manual", "--assignment-mode", "min_group"))
DEFAULT_ROUTER = RouterSpec("vllm-router", "cache_aware")
FIDELITY_TOLERANCE = 0.05  # "within a few percent"
LAG_TOLERANCE = 0.01  # an engine may run behind the wall clock by 1% of the makespan before a row is suspect
LATENCY_REQUESTS = 120


@dataclass(frozen=True)
class PoolSpec:
    """Our side: the pool's placement policy, rebalancing, and its admission: adaptive (or clairvoyant), or, for a
    baseline placed by the pool, the capacity formula's fixed cap or none."""

    policy: str = "available_kv"
    rebalance: bool = True
    oracle: bool = False
    admission: str = "adaptive"  # "adaptive" | "fixed" | "uncapped"
    max_target_scale: float = 1.0  # adaptive: how far past its KV budget it may probe while engines have room


@dataclass(frozen=True)
class Row:
    label: str
    cap: str  # "adaptive" (the pool's own), "uncapped" or "fixed" (the rollout side's cap in front of a router)
    router: RouterSpec | None = None
    pool: PoolSpec | None = None


@dataclass(frozen=True)
class Setup:
    replicas: int
    engine: SimConfig
    workload: WorkloadConfig
    async_steps: int
    time_scale: float
    live: tuple[str, ...] = ()  # live vLLM replicas' URLs; empty: simulated replicas per row
    model: str = MODEL
    token_ratio: float = 1.0  # live tokenizer's tokens per simulated token, for the caps' trace estimates
    vocabulary: tuple[str, ...] = ()  # the chat form's words (routing_lab.chat); empty: the simulator's own
    allowed_token_ids: tuple[int, ...] = ()  # sent with every request (a random model kept to the vocabulary)
    tokenizer: str | None = None  # simulated replicas count tokens with this Hugging Face tokenizer


@dataclass(frozen=True)
class Outcome:
    row: Row
    limit: str
    result: HttpResult
    added_latency_ms: float | None


def rows(only: Sequence[str]) -> list[Row]:
    ours = PoolSpec()
    out = [
        Row("ours: available_kv + rebalance", "adaptive", pool=ours),
        Row("ours, strictly sticky", "adaptive", pool=replace(ours, rebalance=False)),
        Row("clairvoyant order (reference)", "adaptive", pool=replace(ours, oracle=True)),
    ]
    specs = [RouterSpec("vllm-router", p) for p in VLLM_ROUTER_POLICIES]
    specs += [RouterSpec("sglang-router", p[0], p[1:]) for p in SGLANG_ROUTER_POLICIES]
    out += [Row(spec.label, cap, router=spec) for spec in specs for cap in ("uncapped", "fixed")]
    return [r for r in out if not only or any(text in f"{r.label} {r.cap}" for text in only)]


# -- the workload and its caps -----------------------------------------------------------------------


def workload(setup: Setup) -> tuple[list[list[ChatRollout]], list[list[RolloutPlan]]]:
    """The chat rollouts, and their token-exact twin plans for the virtual-time cluster."""
    chats = chat_rollouts(make_workload(setup.workload), setup.workload.system_prompt_tokens, setup.vocabulary)
    return chats, twin_plans(chats)


def step0_trace(twins: Sequence[Sequence[RolloutPlan]], setup: Setup) -> float:
    return setup.token_ratio * statistics.fmean(vt.final_trace(p, setup.engine.max_model_len) for p in twins[0])


def pipeline_cap(setup: Setup) -> int:
    return pipeline_concurrency_cap(setup.async_steps, setup.workload.batch_size, setup.workload.group_size)


def fixed_limit(setup: Setup, twins: Sequence[Sequence[RolloutPlan]]) -> int:
    """The capacity formula with step 0's mean final trace, as ``bench/routing.py`` computes it."""
    per_rank = setup.engine.usable_blocks * setup.engine.block_size / step0_trace(twins, setup)
    return FixedAdmission.from_capacity(pipeline_cap(setup), per_rank, setup.replicas, headroom=0.9).limit


def our_admission(spec: PoolSpec, setup: Setup, twins: Sequence[Sequence[RolloutPlan]]) -> Admission | None:
    if spec.admission == "uncapped":
        return None
    if spec.admission == "fixed":
        return FixedAdmission(fixed_limit(setup, twins))
    admission = AdaptiveAdmission(pipeline_cap(setup), step0_trace(twins, setup),
                                  max_target_scale=spec.max_target_scale)
    if not spec.oracle:
        return admission
    paths = {p.rollout_id: vt.critical_path(p, setup.engine) for batch in twins for p in batch}
    return OracleAdmission(admission, paths)


# -- runs ---------------------------------------------------------------------------------------------


def run_row(row: Row, setup: Setup, chats: Sequence[Sequence[ChatRollout]], twins: Sequence[Sequence[RolloutPlan]],
            replies: Path, logs: Path) -> tuple[HttpResult, str]:
    """One row on fresh replicas (and a fresh router): its result and the admission limit it ran under."""
    with Processes(logs) as procs:
        if setup.live:
            urls = list(setup.live)
            reset_prefix_caches(urls)
        else:
            tokenizer = Path(setup.tokenizer) if setup.tokenizer else None
            urls = procs.replicas(setup.replicas, setup.engine, setup.time_scale, replies, MODEL, tokenizer=tokenizer)
        if row.pool is not None:
            admission = our_admission(row.pool, setup, twins)
            limit = str(admission.limit) if isinstance(admission, FixedAdmission) else row.cap
            return asyncio.run(_serve_pool(row.pool, admission, urls, chats, setup)), limit
        assert row.router is not None
        limit = pipeline_cap(setup) if row.cap == "uncapped" else fixed_limit(setup, twins)
        router_url = procs.router(row.router, urls)
        return asyncio.run(_serve_router(row.router, router_url, limit, urls, chats, setup)), str(limit)


def reset_prefix_caches(urls: Sequence[str]) -> None:
    """Live replicas serve every row: empty their prefix caches, where the server offers it (dev mode)."""
    for url in urls:
        try:
            code = httpx.post(f"{url}/reset_prefix_cache", timeout=30).status_code
        except httpx.HTTPError as exc:
            code = str(exc)
        if code != 200:
            print(f"  (cannot reset {url}'s prefix cache: {code}; start vLLM with VLLM_SERVER_DEV_MODE=1)")


async def _serve_pool(spec: PoolSpec, admission: Admission | None, urls: list[str],
                      chats: Sequence[Sequence[ChatRollout]], setup: Setup) -> HttpResult:
    # One scrape per simulated second, as the virtual-time cluster scrapes.
    async with ServingPool(urls, setup.model, policy=spec.policy, admission=admission, rebalance=spec.rebalance,
                           scrape_interval_s=setup.time_scale) as pool:
        endpoint = PoolEndpoint(pool, forced=forced(setup), extra=extra_body(setup))
        return await serve(chats, endpoint, urls, setup.async_steps, setup.time_scale)


def forced(setup: Setup) -> bool:
    """Each turn asks for exactly its planned length: on live replicas, and wherever the model's own words are
    spoken (a simulated replica with a real tokenizer stands for a live one)."""
    return bool(setup.live or setup.tokenizer)


def extra_body(setup: Setup) -> dict:
    return {"allowed_token_ids": list(setup.allowed_token_ids)} if setup.allowed_token_ids else {}


async def _serve_router(spec: RouterSpec, router_url: str, limit: int, urls: list[str],
                        chats: Sequence[Sequence[ChatRollout]], setup: Setup) -> HttpResult:
    endpoint = RouterEndpoint(router_url, spec.session_header, setup.model, limit, forced=forced(setup),
                              finish_sessions=spec.finishes_sessions, extra=extra_body(setup))
    try:
        return await serve(chats, endpoint, urls, setup.async_steps, setup.time_scale)
    finally:
        await endpoint.aclose()


def run_twin(spec: PoolSpec, setup: Setup, twins: Sequence[Sequence[RolloutPlan]]) -> ClusterResult:
    """The same pool configuration on the same token streams, in virtual time."""
    return run_virtual(setup, twins, spec.policy, spec.rebalance, our_admission(spec, setup, twins))


def run_virtual(setup: Setup, plans: Sequence[Sequence[RolloutPlan]], policy: str, rebalance: bool,
                admission: Admission | None) -> ClusterResult:
    """Plans through the production ``Scheduler`` on a virtual-time cluster shaped like the HTTP run's."""
    config = ClusterConfig(num_replicas=setup.replicas, engine=setup.engine, max_async_steps=setup.async_steps)
    cluster = Cluster(config)
    router = Router(cluster.replica_names, policy, clock=cluster.clock, rebalance=rebalance,
                    metrics_max_age_s=5.0)  # the pool's max(5 s, 3 scrapes) at one scrape per second
    return cluster.run(plans, Scheduler(router, admission))


# -- the router's added latency -----------------------------------------------------------------------


def latency_requests(chats: Sequence[Sequence[ChatRollout]], count: int) -> list[tuple[ChatRollout, list[dict]]]:
    """Real conversations as the run sends them: each rollout's first turns, in order."""
    out: list[tuple[ChatRollout, list[dict]]] = []
    for ro in (ro for batch in chats for ro in batch):
        messages = ro.first_messages()
        for turn in ro.turns[:3]:
            out.append((ro, messages))
            messages = [*messages, {"role": "assistant", "content": turn.reply}, {"role": "user", "content": turn.tool}]
            if len(out) == count:
                return out
    return out


async def added_latency_ms(via: str | ServingPool, header: str | None, direct: Sequence[str],
                           requests: Sequence[tuple[ChatRollout, list[dict]]], model: str) -> float:
    """Median of (through the router or pool − straight to the replica that served it), one request at a
    time. Each request goes through once untimed first (its placement, and a warm prefix cache there);
    then through and straight once each, in alternating order, so both timed sends do the same work.
    Where the replica does not say who it is (live vLLM behind a router), straight goes round ``direct``."""
    async with httpx.AsyncClient(timeout=60) as http:

        async def straight(url: str, ro: ChatRollout, messages: list[dict]) -> float:
            t0 = time.perf_counter()
            response = await http.post(f"{url}/v1/chat/completions",
                                       json=request_body(model, messages, replace(ro, max_tokens=8)))
            response.raise_for_status()
            response.json()
            return time.perf_counter() - t0

        async def routed(ro: ChatRollout, messages: list[dict]) -> tuple[float, str]:
            t0 = time.perf_counter()
            if isinstance(via, ServingPool):
                c = await via.chat(ro.rollout_id, messages, max_tokens=8, group_id=ro.group_id, logprobs=False)
                return time.perf_counter() - t0, c.replica
            response = await http.post(f"{via}/v1/chat/completions", headers={header or "": ro.rollout_id},
                                       json=request_body(model, messages, replace(ro, max_tokens=8)))
            response.raise_for_status()
            response.json()
            served = response.headers.get(REPLICA_HEADER)
            return time.perf_counter() - t0, f"http://{served}" if served else ""

        differences = []
        for i, (ro, messages) in enumerate(requests):
            _, replica = await routed(ro, messages)
            replica = replica or direct[i % len(direct)]
            if i % 2:
                (through, _), alone = await routed(ro, messages), await straight(replica, ro, messages)
            else:
                alone, (through, _) = await straight(replica, ro, messages), await routed(ro, messages)
            differences.append(through - alone)
    return 1000 * statistics.median(differences)


def measure_latencies(specs: Sequence[RouterSpec], setup: Setup, chats: Sequence[Sequence[ChatRollout]],
                      replies: Path, logs: Path) -> dict[str, float]:
    requests = latency_requests(chats, LATENCY_REQUESTS)
    out = {}
    with Processes(logs) as procs:
        urls = list(setup.live) or procs.replicas(setup.replicas, setup.engine, 0.0, replies, MODEL)

        async def ours() -> float:
            async with ServingPool(urls, setup.model, rebalance=True) as pool:
                return await added_latency_ms(pool, None, urls, requests, setup.model)

        out["ours"] = asyncio.run(ours())
        for spec in specs:
            with Processes(logs) as router_procs:
                url = router_procs.router(spec, urls)
                out[spec.label] = asyncio.run(added_latency_ms(url, spec.session_header, urls, requests, setup.model))
    return out


# -- report -------------------------------------------------------------------------------------------


def table(outcomes: Sequence[Outcome], reference: float) -> str:
    head = (f"{'row':<44}{'cap':<10}{'limit':>6}{'makespan s':>11}{'x clairv':>9}{'out tok/s':>10}{'preempt':>8}"
            f"{'% req':>7}{'prefix hit':>11}{'stay':>6}{'+lat ms':>8}{'lag s':>7}{'wall s':>7}")
    lines = [head, "-" * len(head)]
    for o in outcomes:
        r = o.result
        latency = "" if o.added_latency_ms is None else f"{o.added_latency_ms:.2f}"
        lines.append(
            f"{o.row.label:<44}{o.row.cap:<10}{o.limit:>6}{r.makespan_s:>11.1f}{r.makespan_s / reference:>9.2f}"
            f"{r.output_tokens_per_s:>10.0f}{r.replicas.preemptions:>8.0f}{100 * r.preemption_rate:>7.2f}"
            f"{r.prefix_hit_rate:>11.3f}{r.stay_share:>6.2f}{latency:>8}{r.replicas.max_lag_s:>7.2f}{r.wall_s:>7.0f}"
        )
    return "\n".join(lines)


def verdicts(outcomes: Sequence[Outcome], twins: dict[str, ClusterResult]) -> list[str]:
    by = {(o.row.label, o.row.cap): o.result for o in outcomes}
    ours = by.get((rows([])[0].label, "adaptive"))
    reference = by.get((rows([])[2].label, "adaptive"))
    routers = {key: r for key, r in by.items() if key[1] != "adaptive"}
    out = []
    if ours is None:
        return ["(ours did not run: no verdicts)"]
    default = [r.makespan_s for (label, _), r in routers.items() if label == DEFAULT_ROUTER.label]
    if default:
        speedup = min(default) / ours.makespan_s
        out.append(_verdict(f"ours >= 1.10x faster than {DEFAULT_ROUTER.label} as deployed (its better cap)",
                            speedup >= 1.10, f"{speedup:.2f}x"))
    if routers:
        (label, cap), best = min(routers.items(), key=lambda kv: kv[1].makespan_s)
        out.append(_verdict("ours faster than every router policy and cap", best.makespan_s > ours.makespan_s,
                            f"{best.makespan_s / ours.makespan_s:.2f}x; the fastest router row is {label} {cap}, "
                            f"{best.makespan_s:.1f} s"))
    if reference is not None:
        ratio = ours.makespan_s / reference.makespan_s
        out.append(_verdict("ours within 1.10x of the clairvoyant-order makespan (HTTP)", ratio <= 1.10,
                            f"{ratio:.2f}x"))
    if "ours" in twins and "clairvoyant" in twins:
        ratio = twins["ours"].makespan_s / twins["clairvoyant"].makespan_s
        out.append(_verdict("ours within 1.10x of the clairvoyant-order makespan (virtual time)", ratio <= 1.10,
                            f"{ratio:.2f}x"))
    out.append(_verdict("ours: preemptions <= 1% of requests", ours.preemption_rate <= 0.01,
                        f"{100 * ours.preemption_rate:.2f}%"))
    return out


def fidelity(outcomes: Sequence[Outcome], twins: dict[str, ClusterResult]) -> list[str]:
    if not twins:
        return []  # live replicas: nothing simulated to check
    by = {o.row.label: o.result for o in outcomes if o.row.pool is not None}
    out = []
    for name, label in (("ours", rows([])[0].label), ("clairvoyant", rows([])[2].label)):
        if name not in twins or label not in by:
            continue
        http, virtual = by[label], twins[name]
        gap = http.makespan_s / virtual.makespan_s - 1
        same = http.requests == virtual.requests and http.output_tokens == virtual.output_tokens
        out.append(_verdict(
            f"fidelity, {name}: HTTP makespan within {100 * FIDELITY_TOLERANCE:.0f}% of virtual time",
            abs(gap) <= FIDELITY_TOLERANCE,
            f"HTTP {http.makespan_s:.1f} s vs virtual {virtual.makespan_s:.1f} s ({100 * gap:+.1f}%); requests "
            f"{http.requests}/{virtual.requests}, output tokens {http.output_tokens}/{virtual.output_tokens} "
            f"({'identical' if same else 'DIFFERENT'}); preemptions {http.replicas.preemptions:.0f}/"
            f"{virtual.preemptions}; prefix hit {http.prefix_hit_rate:.3f}/{virtual.prefix_hit_rate:.3f}; "
            f"worst engine lag {http.replicas.max_lag_s:.2f} s"))
    lagging = [o for o in outcomes if o.result.replicas.max_lag_s > LAG_TOLERANCE * o.result.makespan_s]
    out.append(_verdict(f"every row's engines kept within {100 * LAG_TOLERANCE:.0f}% of its makespan of the wall clock",
                        not lagging, ", ".join(f"{o.row.label} {o.row.cap}: {o.result.replicas.max_lag_s:.2f} s"
                                               for o in lagging) or "all did"))
    return out


def report(files: Sequence[Path]) -> str:
    """Means over several runs' ``--json`` files: one line per (row, cap), each row's makespan judged
    against the clairvoyant order of its own seed; added latencies from the last file that measured them.
    Files of the same seed merge, a later file's row replacing the same row of an earlier one (a rerun)."""
    latency: dict[str, float] = {}
    by_seed: dict[int, dict[tuple[str, str], dict]] = {}
    virtual: dict[int, float | None] = {}
    for run in (json.loads(path.read_text()) for path in files):
        latency.update(run.get("latency_ms") or {})
        seed = run["setup"]["workload"]["seed"]
        by_seed.setdefault(seed, {}).update({(r["label"], r["cap"]): r for r in run["rows"]})
        virtual[seed] = virtual.get(seed) or run.get("virtual", {}).get("clairvoyant", {}).get("makespan_s")
    groups: dict[tuple[str, str], list[dict]] = {}
    for seed, seed_rows in by_seed.items():
        reference = next((r["makespan_s"] for (label, _), r in seed_rows.items() if label.startswith("clairvoyant")),
                         virtual[seed])
        for key, r in seed_rows.items():
            groups.setdefault(key, []).append({**r, "reference": reference, "seed": seed})
    head = (f"{'row':<44}{'cap':<10}{'runs':>5}{'seeds':>11}{'makespan s':>11}{'x clairv':>9}{'out tok/s':>10}"
            f"{'% preempt':>10}{'prefix hit':>11}{'stay':>6}{'+lat ms':>8}{'lag/mksp':>9}")
    lines = [head, "-" * len(head)]
    means = {}
    for (label, cap), group in groups.items():
        def mean(f: Callable[[dict], float], g: list[dict] = group) -> float:
            return statistics.fmean(f(r) for r in g)

        means[label, cap] = mean(lambda r: r["makespan_s"])
        lat = latency.get("ours" if cap == "adaptive" else label)
        lines.append(
            f"{label:<44}{cap:<10}{len(group):>5}{','.join(sorted({str(r['seed']) for r in group})):>11}"
            f"{means[label, cap]:>11.1f}{mean(lambda r: r['makespan_s'] / r['reference']):>9.2f}"
            f"{mean(lambda r: r['output_tokens'] / r['makespan_s']):>10.0f}"
            f"{mean(lambda r: 100 * r['replicas']['preemptions'] / r['requests']):>10.2f}"
            f"{mean(lambda r: r['replicas']['prefix_hits'] / r['replicas']['prefix_queries']):>11.3f}"
            f"{mean(lambda r: r['stayed_turns'] / r['followup_turns'] if r['followup_turns'] else math.nan):>6.2f}"
            f"{'' if lat is None else f'{lat:.2f}':>8}"
            f"{mean(lambda r: r['replicas']['max_lag_s'] / r['makespan_s']):>9.3f}"
        )
    ours = groups.get((rows([])[0].label, "adaptive"))
    if ours:
        ours_mean = means[rows([])[0].label, "adaptive"]
        routers = {k: v for k, v in means.items() if k[1] != "adaptive"}
        default = [v for (label, _), v in routers.items() if label == DEFAULT_ROUTER.label]
        if default:
            lines.append(_verdict(f"ours >= 1.10x faster than {DEFAULT_ROUTER.label} as deployed (its better cap)",
                                  min(default) / ours_mean >= 1.10, f"{min(default) / ours_mean:.2f}x"))
        if routers:
            (label, cap), best = min(routers.items(), key=lambda kv: kv[1])
            lines.append(_verdict("ours faster than every router policy and cap", best > ours_mean,
                                  f"{best / ours_mean:.2f}x; the fastest router row is {label} {cap}, {best:.1f} s"))
        ratio = statistics.fmean(r["makespan_s"] / r["reference"] for r in ours)
        lines.append(_verdict("ours within 1.10x of the clairvoyant-order makespan", ratio <= 1.10, f"{ratio:.2f}x"))
        rate = statistics.fmean(r["replicas"]["preemptions"] / r["requests"] for r in ours)
        lines.append(_verdict("ours: preemptions <= 1% of requests", rate <= 0.01, f"{100 * rate:.2f}%"))
    return "\n".join(lines)


def _verdict(what: str, met: bool, figure: str) -> str:
    return f"[{'met' if met else 'NOT met'}] {what}: {figure}"


def quick_setup() -> Setup:
    """A tiny workload for the tests: 2 replicas, 2 steps of 4 prompts × 4 rollouts, short turns."""
    engine = SimConfig(num_gpu_blocks=1024, block_size=16, max_num_seqs=64, max_model_len=8192)
    wl = WorkloadConfig(steps=2, batch_size=4, group_size=4, system_prompt_tokens=256, task_prompt_tokens_median=300,
                        turns_median=3, max_turns=8, output_tokens_median=40, tool_tokens_median=60, max_tokens=512)
    return Setup(2, engine, wl, 2, 0.05)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16, help="prompts per training step")
    parser.add_argument("--group", type=int, default=8, help="rollouts per prompt")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--async-steps", type=int, default=2)
    parser.add_argument("--time-scale", type=float, default=0.5, help="real seconds per simulated second")
    parser.add_argument("--only", nargs="*", default=[], help="run only the rows whose label or cap contains a text")
    parser.add_argument("--no-latency", action="store_true", help="skip the added-latency measurement")
    parser.add_argument("--latency-only", action="store_true", help="only the added-latency measurement")
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    parser.add_argument("--logs", type=Path, help="keep the servers' logs here (default: a temporary folder)")
    parser.add_argument("--quick", action="store_true", help="a tiny workload on 2 replicas: a smoke run")
    parser.add_argument("--replica-url", action="append", default=[], help="a live vLLM replica (repeat per replica)")
    parser.add_argument("--report", nargs="+", type=Path, metavar="JSON", help="print the means of earlier runs")
    parser.add_argument("--model", default=MODEL, help="the live replicas' model name")
    args = parser.parse_args(argv)
    if args.report:
        print(report(args.report))
        return 0
    wl = WorkloadConfig(steps=args.steps, batch_size=args.batch, group_size=args.group, seed=args.seed)
    if args.quick:
        setup = replace(quick_setup(), workload=replace(quick_setup().workload, seed=args.seed))
    else:
        setup = Setup(args.replicas, vt.ENGINE, wl, args.async_steps, args.time_scale)
    if args.replica_url:
        setup = live_setup(setup, args.replica_url, args.model)
    chosen = rows(args.only)
    if not chosen:
        parser.error(f"--only {' '.join(args.only)} matches no row")
    found = versions()
    missing = [name for name, v in found.items() if v == "not installed"]
    if missing and any(r.router is not None and r.router.router in missing for r in chosen):
        parser.error(f"{', '.join(missing)} not installed: pip install -e '.[routers]'")
    with tempfile.TemporaryDirectory(prefix="routing-http-") as tmp:
        logs = args.logs or Path(tmp)
        logs.mkdir(parents=True, exist_ok=True)
        return _run(setup, chosen, logs, found, args)


def live_setup(setup: Setup, urls: Sequence[str], model: str) -> Setup:
    """The same workload on live replicas: their KV pool and context limit, real time, and how many of
    their tokens one simulated token makes (measured on the first rollout's first prompt)."""
    async def probe() -> tuple[int, int, int, int]:
        async with httpx.AsyncClient(timeout=600) as http:
            card = (await http.get(f"{urls[0]}/v1/models")).json()["data"][0]
            async with ReplicaClient(urls[0]) as client:
                m = next(iter((await client.metrics()).values()))
            first = workload(setup)[0][0][0]
            body = {"model": model, "messages": first.first_messages(), "max_tokens": 1}
            usage = (await http.post(f"{urls[0]}/v1/chat/completions", json=body)).json()["usage"]
        twin = twin_plans([[first]])[0][0]
        return int(card.get("max_model_len") or 0), m.num_gpu_blocks or 0, m.block_size or 16, \
            round(1000 * usage["prompt_tokens"] / len(twin.prompt))

    max_len, blocks, block_size, ratio_milli = asyncio.run(probe())
    if not blocks:
        raise SystemExit(f"{urls[0]}/metrics has no vllm:cache_config_info: is it a vLLM V1 server?")
    engine = replace(setup.engine, num_gpu_blocks=blocks, block_size=block_size,
                     max_model_len=max_len or setup.engine.max_model_len)
    return replace(setup, replicas=len(urls), engine=engine, time_scale=1.0, live=tuple(urls), model=model,
                   token_ratio=ratio_milli / 1000)


def _run(setup: Setup, chosen: Sequence[Row], logs: Path, found: dict[str, str], args: argparse.Namespace) -> int:
    chats, twins = workload(setup)
    replies = write_replies(chats, logs / "replies.jsonl")
    config = ClusterConfig(num_replicas=setup.replicas, engine=setup.engine, max_async_steps=setup.async_steps)
    where = f"live replicas of {setup.model} ({setup.token_ratio:.2f} tokens per simulated token)" if setup.live \
        else f"time scale {setup.time_scale}"
    print(f"routers: {', '.join(f'{k} {v}' for k, v in found.items())}; {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f} at start; {where}")
    print(f"{setup.replicas} replicas x {setup.engine.usable_blocks * setup.engine.block_size} KV tokens; "
          f"{setup.workload.steps} steps (async {setup.async_steps}) x {setup.workload.batch_size} prompts x "
          f"{setup.workload.group_size} rollouts, seed {setup.workload.seed}; fixed cap {fixed_limit(setup, twins)}, "
          f"pipeline cap {pipeline_cap(setup)}; ideal bound {vt.ideal_makespan(twins, config):.1f} s (simulated)")
    twin_results: dict[str, ClusterResult] = {}
    if not setup.live and not args.latency_only:
        twin_results = {"ours": run_twin(PoolSpec(), setup, twins),
                        "clairvoyant": run_twin(PoolSpec(oracle=True), setup, twins)}
    for name, r in twin_results.items():
        print(f"virtual time, {name}: makespan {r.makespan_s:.1f} s, preempted {100 * r.preemption_rate:.2f}%, "
              f"prefix hit {r.prefix_hit_rate:.3f}, stay {r.stay_share:.2f}")
    latencies: dict[str, float] = {}
    if not args.no_latency:
        specs = list(dict.fromkeys(r.router for r in chosen if r.router is not None))
        latencies = measure_latencies(specs, setup, chats, replies, logs)
        print("added latency per request, p50 ms: " + ", ".join(f"{k} {v:.2f}" for k, v in latencies.items()))
    outcomes = []
    for row in [] if args.latency_only else chosen:
        started = time.perf_counter()
        result, limit = run_row(row, setup, chats, twins, replies, logs)
        latency = latencies.get("ours" if row.pool is not None else row.router.label if row.router else "")
        outcomes.append(Outcome(row, limit, result, latency))
        print(f"  {row.label} ({row.cap}): makespan {result.makespan_s:.1f} s, preempted "
              f"{100 * result.preemption_rate:.2f}%, {time.perf_counter() - started:.0f} s wall, load average "
              f"{os.getloadavg()[0]:.1f}", flush=True)
    reference = next((o.result.makespan_s for o in outcomes if o.row.pool and o.row.pool.oracle), None)
    if reference is None and "clairvoyant" in twin_results:
        reference = twin_results["clairvoyant"].makespan_s
    print(table(outcomes, reference or float("nan")))
    for line in fidelity(outcomes, twin_results) + verdicts(outcomes, twin_results):
        print(line)
    if args.json:
        args.json.write_text(json.dumps({
            "versions": found, "setup": asdict(setup), "latency_ms": latencies,
            "virtual": {k: asdict(v) for k, v in twin_results.items()},
            "rows": [{"label": o.row.label, "cap": o.row.cap, "limit": o.limit, "added_latency_ms": o.added_latency_ms,
                      **{k: v for k, v in asdict(o.result).items() if k != "prompt_tokens"}} for o in outcomes],
        }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
