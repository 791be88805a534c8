"""Grade a finished episode, and apply a task's reference solution (the oracle).

Tests and solutions are copied in only now, so the agent never saw them. The verifier
runs as a one-shot exec, not in the agent's terminal, so it works whatever the agent left
running there (including after an agent timeout).
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from terminus_env.tasks.task import Task, TaskError

if TYPE_CHECKING:
    from terminus_env.sandbox import ExecResult, Sandbox

TESTS_DIR = "/tests"
SOLUTION_DIR = "/solution"
VERIFIER_LOGS = "/logs/verifier"
REWARD_TXT = f"{VERIFIER_LOGS}/reward.txt"
REWARD_JSON = f"{VERIFIER_LOGS}/reward.json"
TEST_STDOUT = f"{VERIFIER_LOGS}/test-stdout.txt"
OUTPUT_CAP = 20_000
"""Characters of verifier output kept in a `GradeResult` (the tail, where the summary is)."""
_LOG_READ_BYTES = 4_000_000
_SETUP_TIMEOUT_S = 60.0
_PYTEST_OUTCOME = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED)\s+\S", re.MULTILINE)
_PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|errors?|xfailed|xpassed|skipped)")
_PYTEST_SUMMARY = re.compile(r"^=+ (.*\d+ (?:passed|failed|errors?).*?) =+$", re.MULTILINE)


@dataclass(frozen=True)
class GradeResult:
    reward: float
    output: str
    """The verifier's stdout and stderr, capped to the last `OUTPUT_CAP` characters."""
    timed_out: bool
    duration_s: float
    reason: str | None = None
    """Why the reward is 0 when the verifier did not say so itself (timeout, missing reward file, ...)."""


async def grade(sandbox: Sandbox, task: Task) -> GradeResult:
    """Copy the tests in, run the verifier once, and read its reward."""
    start = time.monotonic()
    # Nothing the episode left in /tests or /logs/verifier may count; a non-root verifier must write its logs.
    fresh = f"{TESTS_DIR} {VERIFIER_LOGS}"
    await _prepare(sandbox, f"rm -rf {fresh} && mkdir -p {fresh} && chmod a+rwx {VERIFIER_LOGS}")
    if task.tests_dir.is_dir():
        await sandbox.put_dir(task.tests_dir, TESTS_DIR)
    if task.source_format == "terminal-bench-1":
        await sandbox.put_file(task.verifier_script.read_bytes(), f"{TESTS_DIR}/run-tests.sh", mode=0o755)
    # Output goes to a file, not a pipe, so a process the verifier leaves behind cannot hold the exec open.
    result = await sandbox.exec(
        f"bash {TESTS_DIR}/{task.verifier_script.name} > {TEST_STDOUT} 2>&1",
        timeout=task.verifier_timeout_s,
        user=task.verifier_user or "root",  # not the agent's user: the verifier must see everything
        env=dict(task.verifier_env),
    )
    logged = await sandbox.read_file(TEST_STDOUT, max_bytes=_LOG_READ_BYTES)
    output = (logged or b"").decode("utf-8", "replace")
    duration = time.monotonic() - start
    if result.timed_out:
        reason = f"verifier timed out after {task.verifier_timeout_s:g}s"
        return GradeResult(0.0, output[-OUTPUT_CAP:], True, duration, reason)
    if task.source_format == "terminal-bench-1":
        reward, reason = pytest_reward(output)
    else:
        reward, reason = await _read_reward(sandbox)
    return GradeResult(reward, output[-OUTPUT_CAP:], False, duration, reason)


async def apply_oracle(sandbox: Sandbox, task: Task) -> ExecResult:
    """Copy the reference solution to /solution and run it once, under the agent's time limit."""
    if task.solution_path is None:
        raise TaskError(f"{task.path}: no solution to apply ({'; '.join(task.notes) or 'solution missing'})")
    await _prepare(sandbox, f"rm -rf {SOLUTION_DIR} && mkdir -p {SOLUTION_DIR}")
    if task.source_format == "harbor":
        await sandbox.put_dir(task.solution_path.parent, SOLUTION_DIR)
    else:
        await sandbox.put_file(task.solution_path.read_bytes(), f"{SOLUTION_DIR}/{task.solution_path.name}", mode=0o755)
    return await sandbox.exec(
        f"bash {SOLUTION_DIR}/{task.solution_path.name}", timeout=task.agent_time_limit_s, user=task.agent_user
    )


async def _prepare(sandbox: Sandbox, command: str) -> None:
    result = await sandbox.exec(command, timeout=_SETUP_TIMEOUT_S, user="root")
    if result.exit_code != 0 or result.timed_out:
        raise TaskError(f"could not prepare the container for grading ({command!r}): {result.output[-500:]}")


async def _read_reward(sandbox: Sandbox) -> tuple[float, str | None]:
    text = await sandbox.read_file(REWARD_TXT)
    if text is not None:
        return parse_reward_txt(text)
    data = await sandbox.read_file(REWARD_JSON)
    if data is not None:
        return parse_reward_json(data)
    return 0.0, f"the verifier wrote neither {REWARD_TXT} nor {REWARD_JSON}"


def parse_reward_txt(data: bytes) -> tuple[float, str | None]:
    """reward.txt holds one number."""
    try:
        reward = float(data.decode("utf-8").strip())
    except (UnicodeDecodeError, ValueError):
        return 0.0, f"{REWARD_TXT} does not hold a number: {data[:100]!r}"
    if not math.isfinite(reward):
        return 0.0, f"{REWARD_TXT} holds {reward}, not a finite number"
    return reward, None


def parse_reward_json(data: bytes) -> tuple[float, str | None]:
    """reward.json is a dict of numbers: its `reward` key, else the mean of its values."""
    try:
        values = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        return 0.0, f"{REWARD_JSON} is not valid JSON: {exc}"
    if not isinstance(values, dict) or not values:
        return 0.0, f"{REWARD_JSON} must be a non-empty object of numbers, not {data[:100]!r}"
    numbers = [v for v in values.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if len(numbers) != len(values) or not all(math.isfinite(v) for v in numbers):
        return 0.0, f"{REWARD_JSON} holds values that are not finite numbers: {data[:100]!r}"
    if "reward" in values:
        return float(values["reward"]), None
    return sum(numbers) / len(numbers), None


def pytest_reward(output: str) -> tuple[float, str | None]:
    """Terminal-Bench 1: resolved (1) when every pytest test passed, from the `-rA` lines or the summary."""
    outcomes = _PYTEST_OUTCOME.findall(output)
    if outcomes:
        bad = [o for o in outcomes if o in {"FAILED", "ERROR"}]
        if bad or "PASSED" not in outcomes:
            passed = outcomes.count("PASSED")
            return 0.0, f"pytest: {len(bad)} of {len(outcomes)} tests failed or errored, {passed} passed"
        return 1.0, None
    summaries = _PYTEST_SUMMARY.findall(output)
    if not summaries:
        return 0.0, "no pytest summary in the verifier output"
    counts = {kind.rstrip("s"): int(n) for n, kind in _PYTEST_COUNT.findall(summaries[-1])}
    if counts.get("passed", 0) == 0 or counts.get("failed", 0) or counts.get("error", 0):
        return 0.0, f"pytest: {summaries[-1]}"
    return 1.0, None
