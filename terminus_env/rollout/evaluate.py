"""``terminus-env eval``: run a task suite through the env and print a results table.

Lenient by default, like Terminal-Bench, so scores compare with public results; ``--strict``
applies the training semantics. ``--oracle`` replaces the model with each task's solution, which
checks the env end to end; ``--sim N`` serves that oracle from N simulated vLLM replicas through
the serving pool, which checks the whole rollout path (routing, HTTP, token accounting) as well.
``--ray ADDRESS`` runs the sandboxes on the nodes of that Ray cluster instead of this machine's Docker.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Sequence
from typing import Any, TextIO

from terminus_env.metrics import aggregate
from terminus_env.rollout.policy import OraclePolicy, OracleReplies, Policy, ServingPolicy
from terminus_env.rollout.runner import RolloutRunner
from terminus_env.rollout.trajectory import Trajectory
from terminus_env.sandbox.errors import SandboxError
from terminus_env.tasks import Task, load_tasks


def main(args: argparse.Namespace) -> int:
    tasks = load_tasks(args.folder, args.name)
    if sum([bool(args.oracle), bool(args.base_url), bool(args.sim)]) != 1:
        print("eval needs exactly one of: --base-url URL (with --model NAME), --oracle, --sim N", file=sys.stderr)
        return 2
    env_kwargs = {
        "mode": "eval",
        "max_turns": args.max_turns,
        "max_turn_tokens": args.max_turn_tokens,
        **({"strict_format": True, "strict_truncation": True} if args.strict else {}),
    }
    trajectories = asyncio.run(_evaluate(args, tasks, env_kwargs))
    print_results(trajectories, sys.stdout)
    if args.output:
        with args.output.open("w") as sink:
            for trajectory in trajectories:
                sink.write(json.dumps(trajectory.to_dict()) + "\n")
        print(f"trajectories written to {args.output}")
    oracle = args.oracle or bool(args.sim)
    failed = [t for t in trajectories if t.env_error or (oracle and t.reward < 1.0)]
    return 1 if failed else 0


async def _evaluate(args: argparse.Namespace, tasks: Sequence[Task], env_kwargs: dict) -> list[Trajectory]:
    total = len(tasks) * args.trials
    done = 0

    def progress(trajectory: Trajectory) -> None:
        nonlocal done
        done += 1
        outcome = trajectory.error or (trajectory.summary.end_reason if trajectory.summary else "?")
        print(f"[{done}/{total}] {trajectory.task}: reward {trajectory.reward:g} ({outcome})", flush=True)

    async with _policy(args, tasks) as policy, _sandbox_pool(args) as sandbox_pool:
        runner = RolloutRunner(
            policy, env_kwargs=env_kwargs, sandbox_pool=sandbox_pool, max_sandboxes=args.concurrency,
            on_finish=progress,
        )  # fmt: skip
        return await runner.run(tasks, group_size=args.trials)


@contextlib.asynccontextmanager
async def _sandbox_pool(args: argparse.Namespace) -> AsyncIterator[Any]:
    """With ``--ray ADDRESS``, sandboxes on that Ray cluster's nodes; else None (this machine's Docker)."""
    if not args.ray:
        yield None
        return
    try:
        from terminus_env.sandbox.fleet import RaySandboxPool
    except ImportError as exc:
        raise SandboxError(str(exc)) from exc
    async with RaySandboxPool(args.ray) as pool:
        yield pool


@contextlib.asynccontextmanager
async def _policy(args: argparse.Namespace, tasks: Sequence[Task]) -> AsyncIterator[Policy]:
    if args.oracle:
        yield OraclePolicy()
        return
    from terminus_env.serving import ServingPool

    async with contextlib.AsyncExitStack() as stack:
        urls = args.base_url or [await stack.enter_async_context(_oracle_server(tasks)) for _ in range(args.sim)]
        pool = await stack.enter_async_context(ServingPool(urls, args.model or "sim"))
        yield ServingPolicy(pool, max_tokens=args.max_turn_tokens)


@contextlib.asynccontextmanager
async def _oracle_server(tasks: Sequence[Task]) -> AsyncIterator[str]:
    """A simulated vLLM replica on a free local port whose 'model' replies like the oracle."""
    from terminus_env.serving.sim.server import ServerConfig, SimServer

    async with SimServer(ServerConfig(model="sim"), OracleReplies(tasks)) as server:
        yield server.url


def print_results(trajectories: Sequence[Trajectory], out: TextIO) -> None:
    """A table a person can read, then the batch metrics a trainer would plot."""
    rows = [("task", "reward", "turns", "end", "format errors", "seconds")]
    for t in trajectories:
        s = t.summary
        rows.append(
            (
                t.task,
                f"{t.reward:g}",
                str(s.turns if s else 0),
                s.end_reason if s else f"error: {t.error}",
                str(s.format_errors if s else 0),
                f"{t.wall_s:.1f}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for i, row in enumerate(rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip(), file=out)
        if i == 0:
            print("  ".join("-" * w for w in widths), file=out)
    summaries = [t.summary for t in trajectories if t.summary is not None]
    m = aggregate(summaries)
    solved = sum(1 for t in trajectories if t.reward >= 1.0)
    print(
        f"\n{solved}/{len(trajectories)} solved · mean reward {m.mean_reward:.3f} · "
        f"format errors/rollout {m.mean_format_errors:.2f} · opening streak {m.mean_opening_streak:.2f} · "
        f"rescued {m.rescued_count} · env errors {m.env_errors + len(trajectories) - len(summaries)}",
        file=out,
    )
