"""How many tasks need processes the agent left running when the verifier runs?

For each task: apply the reference solution in two sandboxes; grade one as it stands, and in the other stop every
process on the agent's side first (what "kill everything before grading" would do). A task whose reward falls
from 1 to 0 depends on live processes at grading. This is why grading keeps the agent's processes running, on
the other side of a namespace boundary, instead of stopping them (docs/notes/security.md).

    .venv/bin/python bench/live_processes.py [FOLDER ...] [--jobs 4]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from terminus_env.sandbox import Sandbox
from terminus_env.tasks import Task, TaskError, load_task, shipped_tasks_dir, task_image
from terminus_env.tasks.grading import apply_oracle, grade
from terminus_env.tasks.loader import task_dirs


async def reward(task: Task, stop_first: bool) -> float:
    sandbox = await Sandbox.start(task.sandbox_spec(await task_image(task)))
    try:
        await apply_oracle(sandbox, task)
        if stop_first:
            await sandbox.stop_agent()
            await asyncio.sleep(0.5)  # let the kernel finish tearing the namespace down
        return (await grade(sandbox, task)).reward
    finally:
        await sandbox.close()


async def measure(tasks: list[Task], jobs: int) -> list[tuple[str, float, float]]:
    gate = asyncio.Semaphore(jobs)

    async def one(task: Task) -> tuple[str, float, float]:
        async with gate:
            return task.name, await reward(task, False), await reward(task, True)

    return list(await asyncio.gather(*(one(task) for task in tasks)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="*", type=Path, help="folders of tasks (default: the shipped suite)")
    parser.add_argument("--jobs", type=int, default=4)
    args = parser.parse_args()
    tasks = []
    for folder in args.folders or [shipped_tasks_dir()]:
        for path in task_dirs(folder):
            try:
                tasks.append(load_task(path))
            except TaskError as exc:  # e.g. a refused multi-step task: it has no episode to grade
                print(f"skipped {path.name}: {str(exc).splitlines()[0]}", file=sys.stderr)
    rows = asyncio.run(measure(tasks, args.jobs))
    print("| task | reward as it stands | reward with the agent's processes stopped first |")
    print("| --- | --- | --- |")
    for name, kept, stopped in rows:
        print(f"| `{name}` | {kept:g} | {stopped:g} |")
    depend = [name for name, kept, stopped in rows if kept > stopped]
    print(f"\n{len(depend)} of {len(rows)} tasks depend on live processes at grading: {', '.join(depend) or 'none'}")
    broken = [name for name, kept, _ in rows if kept < 1.0]
    if broken:
        print(f"the oracle did not earn 1 on: {', '.join(broken)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
