"""The capacity formula against vLLM's own knee: throughput and preemptions against the admission limit.

For each limit ``c`` of a sweep, an agentic stream runs with ``c`` rollouts in flight (``FixedAdmission(c)``, sessions
placed sticky by live count) and the engines' counters are read over a window (``closed_loop.py``): output tokens/s,
finished rollouts/s, vLLM's preemptions, its queue time, its prefix-cache hits and its FLOP estimate per output token
(the only vLLM counter that sees recomputed work). Two workloads: ``steady``, and ``growing``, whose traces grow during
the run (three phases, turns and output × 1.5 and × 2). Beside the sweep, two controllers on each: the capacity
formula's cap (``FixedAdmission.from_capacity``: 0.9 headroom, the first phase's traces) and the adaptive admission
(``AdaptiveAdmission``, the same prior).

The formula's ``x`` is the usable KV pool in bytes (the block count the engine reports) over the workload's mean trace
in tokens × KV bytes per token (the model's config, checked against what vLLM made of its KV memory); it puts the knee
at ``x × DP``. The engine's knee is the smallest swept limit whose output tokens/s reach 95% of the sweep's best.
Limits run in an interleaved order (low, high, low, ...), so that a drift in the machine's load bends neither end of
the curve.
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from routing_lab.chat import ChatRollout, chat_rollouts
from routing_lab.closed_loop import Point, Window, run_point
from routing_lab.engines import MODEL_NAME, Counters, EngineShape, Fleet, Load
from routing_lab.workload import WorkloadConfig, make_workload
from terminus_env.serving.admission import AdaptiveAdmission, Admission, FixedAdmission
from terminus_env.serving.capacity import kv_bytes_per_token, max_rollout_concurrency, requests_per_rank
from terminus_env.serving.pool import ServingPool

# routing_lab's agentic workload at a CPU's scale: a shared system prompt, a task prompt per group of 4, heavy-tailed
# turns (median 4), output (median 48) and tool output (median 64) with tool waits (median 0.5 s).
STEADY = WorkloadConfig(steps=1, batch_size=300, group_size=4, system_prompt_tokens=256, task_prompt_tokens_median=256,
                        turns_median=4.0, max_turns=16, output_tokens_median=48.0, tool_tokens_median=64.0,
                        max_tokens=512, growth_per_step=0.0)  # fmt: skip
GROWING = dataclasses.replace(STEADY, steps=3, batch_size=120, growth_per_step=0.5)
LIMITS = (4, 8, 16, 24, 32, 48, 64, 96, 128)
QUICK_LIMITS = (4, 16, 64)
# quick: a fixed amount of work per point, whatever the machine's speed. Shorter rollouts (median 2 turns of 24
# tokens, 0.1 s tool waits), enough of them to keep the highest limit full until its window's count is reached.
QUICK_STEADY = dataclasses.replace(STEADY, batch_size=24, turns_median=2.0, max_turns=6, output_tokens_median=24.0,
                                   tool_wait_median_s=0.1)  # fmt: skip
QUICK_WINDOW = Window.counted(warmup_rollouts=2, window_rollouts=6)
KNEE_SHARE = 0.95  # the knee: the smallest limit reaching this share of the sweep's best throughput
TRACE_SAMPLE = 128  # rollouts of the first phase whose traces set the formula's mean
WARMUP_S, WINDOW_S = 15.0, 45.0


@dataclass(frozen=True)
class Formula:
    """The capacity formula on these engines: per replica ``x``, the knee it predicts (``x × DP``) and its cap."""

    kv_bytes_per_token: int
    pool_bytes: int  # usable per replica
    mean_trace_tokens: float
    x: float
    knee: float  # x × DP
    cap: int  # FixedAdmission.from_capacity: min(pipeline cap, floor(x × DP × 0.9))


def planned_traces(rollouts: Sequence[ChatRollout], model_dir: Path, max_model_len: int) -> list[int]:
    """Each rollout's final trace in the model's tokens (its last prompt and last output), ended where vLLM would
    refuse its next prompt (at the context limit)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    out = []
    for ro in rollouts:
        messages = ro.first_messages()
        trace = 0
        for turn in ro.turns:
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
            prompt = len(ids)
            if prompt >= max_model_len:
                break
            output = len(turn.reply.split()) + 1
            trace = min(prompt + output, max_model_len)
            messages = [*messages, {"role": "assistant", "content": turn.reply}, {"role": "user", "content": turn.tool}]
        out.append(trace)
    return out


def formula(model_dir: Path, shape: EngineShape, engine_blocks: int, mean_trace: float, pipeline_cap: int) -> Formula:
    per_token = kv_bytes_per_token(model_dir)
    pool_bytes = (engine_blocks - 1) * shape.block_size * per_token  # vLLM keeps one block back (its null block)
    x = requests_per_rank(pool_bytes, mean_trace, per_token)
    return Formula(per_token, pool_bytes, mean_trace, x, x * shape.replicas,
                   max_rollout_concurrency(pipeline_cap, x, shape.replicas, headroom=0.9))


def interleaved(values: Sequence[int]) -> list[int]:
    """Low, high, next low, next high, ...: a drift in the machine's load bends no side of the curve."""
    ordered, out = sorted(values), []
    while ordered:
        out.append(ordered.pop(0))
        if ordered:
            out.append(ordered.pop())
    return out


def controllers(limits: Sequence[int], f: Formula, pipeline_cap: int) -> list[tuple[str, Admission]]:
    out: list[tuple[str, Admission]] = [(f"fixed {c}", FixedAdmission(c)) for c in interleaved(limits)]
    out.append((f"formula {f.cap}", FixedAdmission(f.cap)))
    out.append(("adaptive", AdaptiveAdmission(pipeline_cap, f.mean_trace_tokens)))
    return out


def sweep(urls: Sequence[str], phases: Sequence[Sequence[ChatRollout]], runs: Sequence[tuple[str, Admission]],
          window: Window, time_scale: float, side: str, extra: dict) -> list[Point]:
    points = []
    for label, admission in runs:
        point = asyncio.run(_point(urls, label, admission, phases, window, time_scale, extra))
        print(f"  {side:6} {label:12} in flight {point.in_flight:5.1f}  {point.tokens_per_s:6.0f} tok/s  "
              f"{point.preempted_per_100:5.2f} preempted/100 req  queue {1000 * point.queue_s:6.1f} ms  "
              f"({point.wall_s:.0f} s wall, load {point.load_average:.1f}"
              f"{f', engine lag {point.lag_s:.2f} s' if point.lag_s else ''})", flush=True)
        points.append(point)
    return points


async def _point(urls: Sequence[str], label: str, admission: Admission, phases: Sequence[Sequence[ChatRollout]],
                 window: Window, time_scale: float, extra: dict) -> Point:
    async with ServingPool(urls, MODEL_NAME, policy="requests", admission=admission,
                           scrape_interval_s=time_scale) as pool:
        return await run_point(label, pool, phases, window, time_scale, extra)


def swept(points: Sequence[Point]) -> list[tuple[int, Point]]:
    return sorted((int(p.label.split()[1]), p) for p in points if p.label.startswith("fixed "))


def knee(points: Sequence[Point]) -> int:
    """The smallest swept limit whose output tokens/s reach ``KNEE_SHARE`` of the sweep's best."""
    curve = swept(points)
    best = max(p.tokens_per_s for _, p in curve)
    return next(c for c, p in curve if p.tokens_per_s >= KNEE_SHARE * best)


def preemption_onset(points: Sequence[Point]) -> int | None:
    """The smallest swept limit at which vLLM preempted at least one request in 100."""
    return next((c for c, p in swept(points) if p.preempted_per_100 >= 1.0), None)


def table(name: str, engine: Sequence[Point], sim: Sequence[Point]) -> str:
    flops0 = min((p.flops_per_token for p in engine if p.flops_per_token), default=0.0)
    sims = {p.label: p for p in sim}
    head = (f"{'limit':<13}{'in flight':>10}{'tok/s':>8}{'ro/s':>6}{'pre/100':>8}{'queue ms':>9}{'prefix':>7}"
            f"{'FLOPs/tok':>10}{'KV used':>8}{'spread':>7}{'load':>6}  | sim:{'tok/s':>7}{'pre/100':>8}{'queue ms':>9}"
            f"{'prefix':>7}")
    lines = [f"{name}:", head, "-" * len(head)]
    order = [p for _, p in swept(engine)] + [p for p in engine if not p.label.startswith("fixed ")]
    for p in order:
        s = sims.get(p.label)
        tail = (f"{s.tokens_per_s:>7.0f}{s.preempted_per_100:>8.2f}{1000 * s.queue_s:>9.1f}{s.prefix_hit:>7.3f}"
                if s else "")
        lines.append(
            f"{p.label:<13}{p.in_flight:>10.1f}{p.tokens_per_s:>8.0f}{p.rollouts_per_s:>6.2f}{p.preempted_per_100:>8.2f}"
            f"{1000 * p.queue_s:>9.1f}{p.prefix_hit:>7.3f}{p.flops_per_token / flops0 if flops0 else 0:>10.2f}"
            f"{statistics.fmean(p.load.kv_usage):>8.2f}{p.load.kv_spread:>7.2f}{p.load_average:>6.1f}  |    {tail}")
    return "\n".join(lines)


def verdicts(name: str, f: Formula, engine: Sequence[Point], sim: Sequence[Point]) -> list[str]:
    k = knee(engine)
    onset = preemption_onset(engine)
    out = [f"{name}: formula x = {f.x:.2f} per replica, x × DP = {f.knee:.1f} (mean trace {f.mean_trace_tokens:.0f} "
           f"tokens), its cap {f.cap}; engine knee {k} ({k / f.knee:.2f}x the formula's); preemption onset "
           f"{onset if onset is not None else 'none in the sweep'}"]
    if sim:
        out.append(f"{name}: simulator knee {knee(sim)}, preemption onset {preemption_onset(sim)}")
    by = {p.label: p for p in engine}
    adaptive, fixed = by.get("adaptive"), by.get(f"formula {f.cap}")
    if adaptive and fixed:
        out.append(f"{name}: adaptive {adaptive.tokens_per_s:.0f} tok/s at {adaptive.in_flight:.1f} in flight, "
                   f"{adaptive.preempted_per_100:.2f} preempted/100 req; the formula's cap {fixed.tokens_per_s:.0f} "
                   f"tok/s at {fixed.in_flight:.1f}, {fixed.preempted_per_100:.2f}; ratio "
                   f"{adaptive.tokens_per_s / fixed.tokens_per_s:.2f}x")
    return out


def figure(path: Path, results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["workloads"])
    fig, axes = plt.subplots(1, len(names), figsize=(6.5 * len(names), 4.6), squeeze=False)
    for ax, name in zip(axes[0], names):
        w = results["workloads"][name]
        right = ax.twinx()
        for side, style in (("engine", "-"), ("sim", "--")):
            points = [revive(p) for p in w.get(side, [])]
            curve = swept(points)
            if not curve:
                continue
            xs = [c for c, _ in curve]
            ax.plot(xs, [p.tokens_per_s for _, p in curve], style, marker="o", color="tab:blue",
                    label=f"output tok/s ({'vLLM' if side == 'engine' else 'simulator'})")
            right.plot(xs, [p.preempted_per_100 for _, p in curve], style, marker="s", color="tab:red",
                       label=f"preempted / 100 req ({'vLLM' if side == 'engine' else 'simulator'})")
            for p in points:
                if not p.label.startswith("fixed ") and side == "engine":
                    ax.plot([p.in_flight], [p.tokens_per_s], marker="*" if p.label == "adaptive" else "D",
                            markersize=12, color="tab:green" if p.label == "adaptive" else "tab:purple",
                            linestyle="none", label=f"{p.label} (vLLM)")
        f = w["formula"]
        ax.axvline(f["knee"], color="black", linestyle=":", label=f"formula x·DP = {f['knee']:.1f}")
        late = f["knee"] * f["mean_trace_tokens"] / w["mean_trace_last_phase"]
        if abs(late - f["knee"]) > 0.05 * f["knee"]:
            ax.axvline(late, color="grey", linestyle=":", label=f"x·DP with the last phase's traces = {late:.1f}")
        if "engine_knee" in w:
            ax.axvline(w["engine_knee"], color="tab:blue", linestyle="-.", alpha=0.6,
                       label=f"vLLM's knee = {w['engine_knee']}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("rollouts in flight (admission limit)")
        ax.set_ylabel("output tokens / s")
        right.set_ylabel("preemptions per 100 requests")
        shape = results["shape"]
        ax.set_title(f"{name}: {shape['replicas']} vLLM CPU replicas, {shape['num_blocks']} blocks × "
                     f"{shape['block_size']} tokens of KV each", fontsize=10)
        handles = ax.get_legend_handles_labels()
        more = right.get_legend_handles_labels()
        ax.legend(handles[0] + more[0], handles[1] + more[1], fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def revive(p: dict) -> Point:
    """A point back from its JSON."""
    return Point(**{**p, "counters": Counters(**p["counters"]),
                    "per_replica": tuple(Counters(**c) for c in p["per_replica"]), "load": Load(**p["load"]),
                    "final_traces": tuple(p["final_traces"])})  # fmt: skip


@dataclass(frozen=True)
class Plan:
    """What a knee run does: its workloads as chat, their windows and their formulas."""

    names: tuple[str, ...]
    limits: tuple[int, ...]
    chats: dict[str, list[list[ChatRollout]]]
    windows: dict[str, Window]
    formulas: dict[str, Formula]
    mean_trace_last_phase: dict[str, float]


def prepare(fleet: Fleet, names: Sequence[str], limits: Sequence[int], quick: bool, warmup_s: float | None = None,
            window_s: float | None = None) -> Plan:
    """The workloads in the fleet's words, their windows, and the formula's numbers from the engine's reported blocks
    and the first phase's planned traces. Quick: the steady stream only, cut down (``QUICK_STEADY``), each point
    counted in rollouts (``QUICK_WINDOW``) unless a warm-up or a window in seconds is given."""
    counted = quick and warmup_s is None and window_s is None
    warmup = warmup_s if warmup_s is not None else WARMUP_S
    window = window_s if window_s is not None else WINDOW_S
    configs = {"steady": QUICK_STEADY} if quick else {"steady": STEADY, "growing": GROWING}
    if set(names) - set(configs):
        raise ValueError(f"no workload {sorted(set(names) - set(configs))} in this mode; it has {sorted(configs)}")
    chats, windows, formulas, last = {}, {}, {}, {}
    pipeline_cap = max(limits)
    for name in names:
        config = configs[name]
        chats[name] = chat_rollouts(make_workload(config), config.system_prompt_tokens, fleet.words)
        if counted:
            needed = pipeline_cap + QUICK_WINDOW.warmup_rollouts + QUICK_WINDOW.window_rollouts
            if len(chats[name][0]) <= needed:
                raise ValueError(f"{name}: {len(chats[name][0])} rollouts cannot keep {pipeline_cap} in flight "
                                 f"through a window of {needed} finished")  # fmt: skip
            windows[name] = QUICK_WINDOW
        else:
            phase_s = (warmup + window) / config.steps if config.steps > 1 else 0.0
            windows[name] = Window(warmup, window, phase_s)
        traces = planned_traces(chats[name][0][:TRACE_SAMPLE], fleet.model_dir, fleet.shape.max_model_len)
        formulas[name] = formula(fleet.model_dir, fleet.shape, fleet.blocks, statistics.fmean(traces), pipeline_cap)
        if len(chats[name]) > 1:
            traces = planned_traces(chats[name][-1][:TRACE_SAMPLE], fleet.model_dir, fleet.shape.max_model_len)
        last[name] = statistics.fmean(traces)
    return Plan(tuple(names), tuple(limits), chats, windows, formulas, last)


def run_side(plan: Plan, urls: Sequence[str], time_scale: float, side: str, extra: dict,
             names: Sequence[str] | None = None) -> dict[str, list[Point]]:
    """Every workload's (or ``names``') sweep and controllers on ``urls`` (vLLM's or the simulator's replicas)."""
    out = {}
    for name in plan.names if names is None else names:
        runs = controllers(plan.limits, plan.formulas[name], max(plan.limits))
        print(f"{name} on {side}:", flush=True)
        out[name] = sweep(urls, plan.chats[name], runs, plan.windows[name], time_scale, side, extra)
    return out


def results(plan: Plan, engine: dict[str, list[Point]], sim: dict[str, list[Point]]) -> dict:
    """The run as JSON: per workload its formula, its points on each side and the knees."""
    out = {"limits": list(plan.limits), "workloads": {}}
    for name in plan.names:
        w = {"formula": dataclasses.asdict(plan.formulas[name]), "window": dataclasses.asdict(plan.windows[name]),
             "mean_trace_last_phase": plan.mean_trace_last_phase[name],
             "engine": [dataclasses.asdict(p) for p in engine.get(name, [])], "engine_knee": knee(engine[name])}
        if sim.get(name):
            w |= {"sim": [dataclasses.asdict(p) for p in sim[name]], "sim_knee": knee(sim[name])}
        out["workloads"][name] = w
    return out


def report(data: dict) -> str:
    lines = []
    for name, w in data["workloads"].items():
        engine = [revive(p) for p in w["engine"]]
        sim = [revive(p) for p in w.get("sim", [])]
        lines.append(table(name, engine, sim))
        lines += verdicts(name, Formula(**w["formula"]), engine, sim)
    return "\n".join(lines)
