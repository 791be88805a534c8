"""Demonstrations for the supervised start: real episodes whose replies are Terminus-format turns typing the task's
own solution (``solution/solve.sh``), recorded whole, so the model learns from the very prompts, feedback and terminal
output the env produces.

Each task is played twice under lenient rules: once as it should go (the commands, then the confirmation), and once
with the first turn missing its opening ``<response>`` (rejected, nothing runs), followed by the correct turns. The
supervised mix of the two sets the start's format-error rate. A demonstration that does not earn reward 1 is refused:
its commands would teach a wrong solution.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from terminus_env.env import Reply
from terminus_env.rollout import RolloutRunner
from terminus_env.rollout.policy import PolicyOutput, Rollout
from terminus_env.rollout.trajectory import Trajectory
from terminus_env.tasks import Task

ANALYSIS = "The terminal is ready and nothing has been done yet."
PLAN = "Run the commands that do the task, then mark it complete."
CONFIRM_ANALYSIS = "The commands ran."
CONFIRM_PLAN = "Confirm that the task is complete."
OPENING = "<response>\n"
COMMAND_WAIT_S = 5.0  # an upper bound: the terminal returns as soon as the shell is idle again
# Lenient, so that the broken opening is fed back and the episode goes on to the correct turns.
RECORDING_ENV = {"mode": "train", "strict_format": False, "strict_truncation": False, "max_turns": 4}


@dataclass(frozen=True)
class Demo:
    """One recorded episode: its conversation, and whether its first turn is the broken opening."""

    task: str
    broken_opening: bool
    messages: list[dict[str, str]]


def solution_commands(task: Task) -> list[str]:
    """The solution script's commands, one per entry, as a person would type them into the shell.

    Comments, blank lines and ``set`` options are dropped (``set -e`` would close the interactive shell on the first
    failing command); a line ending in a backslash continues into the next entry's command."""
    if task.solution_path is None or not task.solution_path.is_file():
        raise ValueError(f"task {task.name} ships no solution script; pick tasks with solution/solve.sh")
    commands: list[str] = []
    pending = ""
    for line in task.solution_path.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#") or stripped.startswith("set -")):
            continue
        pending += line + "\n"
        if not line.endswith("\\"):
            commands.append(pending)
            pending = ""
    if pending or not commands:
        raise ValueError(f"task {task.name}: solve.sh has no command, or ends inside a continued line")
    return commands


def solution_reply(task: Task) -> str:
    """The turn that does the task: its commands, and ``task_complete`` (the env then asks to confirm)."""
    keys = "".join(f'<keystrokes duration="{COMMAND_WAIT_S:g}">{c}</keystrokes>\n' for c in solution_commands(task))
    return (
        f"{OPENING}<analysis>{ANALYSIS}</analysis>\n<plan>{PLAN}</plan>\n<commands>\n{keys}</commands>\n"
        "<task_complete>true</task_complete>\n</response>"
    )


def confirm_reply() -> str:
    return (
        f"{OPENING}<analysis>{CONFIRM_ANALYSIS}</analysis>\n<plan>{CONFIRM_PLAN}</plan>\n<commands></commands>\n"
        "<task_complete>true</task_complete>\n</response>"
    )


def broken_opening(reply: str) -> str:
    """The same turn without its opening ``<response>``: the parser rejects it, so nothing runs."""
    if not reply.startswith(OPENING):
        raise ValueError("a demonstration reply starts with <response>")
    return reply[len(OPENING) :]


class DemoPolicy:
    """Plays the demonstrations: the solution turn, then the confirmation; a rollout in ``broken`` opens with the
    solution turn missing its ``<response>``."""

    def __init__(self, broken: set[str]) -> None:
        self._broken = broken

    @contextlib.asynccontextmanager
    async def session(self, rollout: Rollout) -> AsyncIterator[None]:
        yield

    async def act(self, rollout: Rollout, messages: list[dict[str, str]]) -> PolicyOutput:
        turn = sum(1 for m in messages if m["role"] == "assistant")
        if rollout.rollout_id in self._broken:
            if turn == 0:
                return PolicyOutput(reply=Reply(text=broken_opening(solution_reply(rollout.task))))
            turn -= 1
        return PolicyOutput(reply=Reply(text=solution_reply(rollout.task) if turn == 0 else confirm_reply()))


async def record(tasks: Sequence[Task], max_sandboxes: int = 4) -> list[Demo]:
    """Both demonstrations of every task, played in real sandboxes; raises if one does not go as scripted."""
    rollouts = [Rollout(f"{t.name}-{kind}", t.name, t) for t in tasks for kind in ("clean", "broken")]
    policy = DemoPolicy({r.rollout_id for r in rollouts if r.rollout_id.endswith("-broken")})
    runner = RolloutRunner(policy, env_kwargs=RECORDING_ENV, max_sandboxes=max_sandboxes)
    trajectories = await asyncio.gather(*(runner.run_one(r) for r in rollouts))
    return [_checked(t, t.rollout_id.endswith("-broken")) for t in trajectories]


def _checked(trajectory: Trajectory, broken: bool) -> Demo:
    summary = trajectory.summary
    expected = (1.0, int(broken), 3 if broken else 2)
    got = None if summary is None else (summary.reward, summary.format_errors, summary.turns)
    if got != expected:
        why = trajectory.error or (summary and (summary.failure or summary.end_reason))
        raise RuntimeError(
            f"the {'broken' if broken else 'clean'} demonstration of {trajectory.task} went {got} (reward, format "
            f"errors, turns), not {expected}: {why}. Its solve.sh does not work typed into a shell; leave the task out"
        )
    return Demo(trajectory.task, broken, trajectory.messages)


def save(demos: Sequence[Demo], path: Path) -> None:
    path.write_text("".join(json.dumps(asdict(d)) + "\n" for d in demos))


def load(path: Path) -> list[Demo]:
    return [Demo(**json.loads(line)) for line in path.read_text().splitlines() if line]
