"""A synthetic eval for the job page's tests and its benchmark (bench/view_pages.py): a run file and its Harbor job
folder written by the eval's own writers (``RunLog``, ``HarborJob``), from rollouts made up here rather than played.

Its trials end in every way the page must show: solved and unsolved completions, time and turn limits, a full
context, strict format errors, a broken shell, tampering reported beside a reward that stands, env errors whose
sandbox never started, and one task that did not load (its every trial never ran). Seeded: the same arguments write
the same rollouts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from terminus_env.cli.evaluate import rollout_record
from terminus_env.env import EpisodeSummary
from terminus_env.records.atif import agent_spec
from terminus_env.records.harbor_job import HarborJob
from terminus_env.records.report import build_report
from terminus_env.records.run_log import RolloutRecord, RunConfig, RunLog, TaskErrorRecord, TaskStage, read_run
from terminus_env.rollout.trajectory import Trajectory, TurnRecord
from terminus_env.rules import EndReason

CATEGORIES = ("files", "services", "data", "security")
BROKEN_TASK = "task-broken"
TAMPER_FINDING = {"kind": "conftest", "path": "/app/conftest.py", "detail": "a pytest plugin the agent wrote"}
ENDINGS = (
    (EndReason.TASK_COMPLETE, 70), (EndReason.AGENT_TIMEOUT, 8), (EndReason.MAX_TURNS, 5),
    (EndReason.CONTEXT_LIMIT, 4), (EndReason.FORMAT_ERROR, 5), (EndReason.TURN_TRUNCATED, 2),
    (EndReason.SHELL_LOST, 2), (EndReason.ENV_ERROR, 4),
)  # fmt: skip
"""How often (weights) each ending is drawn."""


@dataclass(frozen=True)
class _Task:
    """What the eval's record of a rollout reads of its task."""

    name: str
    category: str


@dataclass(frozen=True)
class Synthetic:
    run_file: Path
    job: Path
    rollouts: list[RolloutRecord]
    """As the run file holds them."""


def task_names(tasks: int) -> list[str]:
    return [f"task-{i:03d}" for i in range(tasks)]


def write_synthetic_job(root: Path, *, tasks: int, trials: int, seed: int = 0, broken: bool = True) -> Synthetic:
    """``tasks`` tasks (one of them broken when ``broken``) × ``trials`` trials, as ``root/run.jsonl`` and
    ``root/jobs/run``."""
    rng = random.Random(seed)
    names = task_names(tasks - 1 if broken else tasks)
    folder = root / "suite"
    config = RunConfig(folder=str(folder), names=(), trials=trials, policy="model:synthetic", strict_format=False,
                       strict_truncation=False, max_turns=30, max_turn_tokens=4096)  # fmt: skip
    run_file = root / "run.jsonl"
    log = RunLog.create(run_file, config)
    paths = {name: folder / name for name in [*names, *([BROKEN_TASK] if broken else [])]}
    job = HarborJob.open(root / "jobs" / "run", agent_spec(config), paths, trials=trials, concurrency=4, resume=False)
    started = 1_800_000_000.0
    for index, name in enumerate(names):
        skill = rng.random()  # how often this task is solved
        for trial in range(trials):
            record = _rollout(rng, name, CATEGORIES[index % len(CATEGORIES)], trial, skill, started)
            started += record.wall_s
            log.append(record)
            job.add_rollout(record)
    if broken:
        log.append(TaskErrorRecord(BROKEN_TASK, TaskStage.LOAD, "TaskError: task.toml: Expected '=' (line 1)",
                                   category="files"))  # fmt: skip
    log.close()
    contents = read_run(run_file)
    problems = job.finish(contents, build_report(contents), finished=True)
    assert not problems, problems
    return Synthetic(run_file, job.path, contents.rollouts)


def _rollout(rng: random.Random, task: str, category: str, trial: int, skill: float, at: float) -> RolloutRecord:
    trajectory = synthetic_trajectory(rng, task, trial, skill, at)
    return rollout_record(_Task(task, category), trial, trajectory)  # type: ignore[arg-type]


def synthetic_trajectory(
    rng: random.Random, task: str, trial: int, skill: float, at: float,
    endings: tuple[tuple[EndReason, float], ...] = ENDINGS,
) -> Trajectory:  # fmt: skip
    """One rollout as the runner returns it, ending as drawn from ``endings``; solved with odds ``skill`` when
    graded."""
    reasons, weights = zip(*endings)
    ending = rng.choices(reasons, weights)[0]
    turns_played = rng.randint(2, 8)
    trajectory = Trajectory(rollout_id=f"{task}#{trial}", task=task, group_id=task, started_at=at, wall_s=0.0)
    if ending is EndReason.ENV_ERROR:  # the sandbox never started: no episode, no observation
        trajectory.error = "SandboxError: the container did not start: no space left on device"
        trajectory.wall_s = round(rng.uniform(1, 5), 3)
        return trajectory
    opening = rng.random() < 0.3 or ending is EndReason.FORMAT_ERROR
    messages = [{"role": "user", "content": f"The format rules ... Task: {task}: do the thing.\n\nroot@box:/app# "}]
    clock = round(rng.uniform(2, 6), 3)
    trajectory.ready_s, trajectory.screen = clock, "root@box:/app# "
    tokens = 900
    for number in range(turns_played):
        malformed = number == 0 and opening
        reply = "I will just look around." if malformed else _reply(rng, number, done=number == turns_played - 1)
        clock += rng.uniform(1, 20)
        replied = round(clock, 3)
        clock += rng.uniform(0.2, 5)
        output = "" if malformed else "\n".join(f"line {n} of the output of turn {number + 1}" for n in range(8))
        completion = rng.randint(80, 600)
        trajectory.turns.append(TurnRecord(
            reply=reply, finish_reason="stop", prompt_tokens=tokens, completion_tokens=completion,
            format_error="no <response> in the reply" if malformed else None,
            commands=[] if malformed else [{"keystrokes": "ls -la /app\n", "duration": 1.0}],
            terminal=None if malformed else {"text": output, "is_screen": False},
            replied_s=replied, observed_s=round(clock, 3),
        ))  # fmt: skip
        tokens += completion + 300
        observation = "Your reply had no <response>." if malformed else f"New terminal output:\n{output}"
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": observation}]
        if ending is EndReason.FORMAT_ERROR and malformed:
            break
    trajectory.messages = messages[:-1]  # the last observation was never sent
    graded = ending.graded
    solved = graded and rng.random() < skill
    reward = 1.0 if solved else 0.0
    failure = None if solved else "../tests/test_outputs.py::test_result: AssertionError: the output is wrong"
    if graded:
        trajectory.grade_s = round(rng.uniform(0.5, 3), 3)
        passed = "PASSED" if solved else "FAILED"
        trajectory.verifier = {
            "test-stdout.txt": "============================= test session starts ==============================\n"
            + "".join(f"{passed} ../tests/test_outputs.py::test_check_{n}\n" for n in range(12))
            + ("" if solved else f"{failure}\n") + "========================= short test summary info =========\n",
            "reward.txt": f"{int(reward)}\n",
        }  # fmt: skip
    flagged = ending is EndReason.TAMPERED or (graded and rng.random() < 0.03)  # eval: reported beside the reward
    tampering = (TAMPER_FINDING,) if flagged else ()
    format_errors = 1 if opening else 0
    trajectory.wall_s = round(clock + (trajectory.grade_s or 0.0), 3)
    summary = EpisodeSummary(
        task=task, reward=reward, end_reason=ending, turns=len(trajectory.turns), format_errors=format_errors,
        format_error_opening_streak=format_errors, warnings=0, truncated_turns=int(ending is EndReason.TURN_TRUNCATED),
        graded=graded, masked=False, rescued=format_errors > 0 and reward > 0, grade_reason=None, error=None,
        fault=ending.fault, failure=None if solved else failure,
        tampering=tampering,
    )  # fmt: skip
    trajectory.summary = summary
    return trajectory


def _reply(rng: random.Random, number: int, *, done: bool) -> str:
    complete = "<task_complete>true</task_complete>" if done else ""
    return (f"<response><analysis>Turn {number + 1}: the listing shows {rng.randint(2, 40)} files; the config is "
            "not where the task says.</analysis><plan>Look at the folder, then fix the config.</plan><commands>"
            f"<keystrokes duration=\"1.0\">ls -la /app\n</keystrokes></commands>{complete}</response>")  # fmt: skip


def strict_training_steps(steps: int, batch: int, seed: int = 0) -> list[list[Trajectory]]:
    """The batches of a strict training run that learns the format: format errors end most episodes at first and
    fewer each step, and more of the rest are solved."""
    rng = random.Random(seed)
    batches = []
    for step in range(steps):
        learnt = step / max(steps - 1, 1)
        endings = ((EndReason.FORMAT_ERROR, 60 * (1 - learnt) + 3), (EndReason.TASK_COMPLETE, 30 + 50 * learnt),
                   (EndReason.AGENT_TIMEOUT, 5), (EndReason.TAMPERED, 2), (EndReason.ENV_ERROR, 2))  # fmt: skip
        batches.append([synthetic_trajectory(rng, f"task-{n % 4}", n, 0.2 + 0.6 * learnt, 0.0, endings)
                        for n in range(batch)])  # fmt: skip
    return batches
