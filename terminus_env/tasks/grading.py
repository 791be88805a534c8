"""Grade a finished episode, and apply a task's reference solution (the oracle).

Tests and solutions are copied in only now, so the agent never saw them. The verifier runs on the
sandbox's host side (see ``Sandbox.verify``): its /tests and /logs/verifier are folders the agent's
side cannot reach, and its processes are invisible from there, so nothing the agent left running can
change the tests or forge the reward, while services the agent started keep answering the tests.
It runs as a one-shot command, not in the agent's terminal, so it works whatever the agent left
running there (including after an agent timeout).

Rewards are decimal numbers in [0, 1] (Python's ``float("1_0")`` is 10; here it is refused): anything else
is a verifier fault, counted as 0 with the reason.
"""

from __future__ import annotations

import io
import json
import math
import re
import tarfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from terminus_env.utils.plain_numbers import read_decimal
from terminus_env.tasks.task import Task, TaskError

if TYPE_CHECKING:
    from terminus_env.sandbox import ExecResult, Sandbox
    from terminus_env.sandbox.tamper import Finding

TESTS_DIR = "/tests"
SOLUTION_DIR = "/solution"
VERIFIER_LOGS = "/logs/verifier"
REWARD_TXT = f"{VERIFIER_LOGS}/reward.txt"
REWARD_JSON = f"{VERIFIER_LOGS}/reward.json"
TEST_STDOUT = f"{VERIFIER_LOGS}/test-stdout.txt"
CTRF_REPORT = f"{VERIFIER_LOGS}/ctrf.json"
OUTPUT_CAP = 20_000
"""Characters of verifier output kept in a `GradeResult` (the tail, where the summary is)."""
KEPT_FILE_CAP = 200_000
"""Bytes of a reward or CTRF file kept whole in a `GradeResult`; a larger one is not kept (cut JSON reads as none)."""
VERIFIER_OUTPUT_NAME = "test-stdout.txt"
"""The verifier's output, by its name in a Harbor trial's ``verifier/`` folder (the other kept files keep theirs)."""
_LOG_READ_BYTES = 4_000_000
_SETUP_TIMEOUT_S = 60.0
_SUMMARY_HEADER = re.compile(r"^=+ short test summary info =+$", re.MULTILINE)
_SECTION_RULE = re.compile(r"^=+ ", re.MULTILINE)
_PYTEST_OUTCOME = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED) \S", re.MULTILINE)
"""A line of pytest's short test summary (``-rA``): the outcome, one space, the test. Only the summary's own section is
read: a captured log line of a passing test (``ERROR    logger:file.py:98 ...``) is not an outcome."""
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
    failure: str | None = None
    """The first failing test and its assertion, from the CTRF report or pytest's output (`first_failure`)."""
    tampering: tuple[Finding, ...] = ()
    """What the verifier ran that the agent changed in the verifier's runtime (``sandbox/tamper.py``); the env
    decides what that does to the episode (``TamperPolicy``)."""
    files: tuple[tuple[str, str], ...] = ()
    """The verifier's files by their names in Harbor's ``verifier/`` folder: ``test-stdout.txt`` (the output, its last
    `OUTPUT_CAP` characters), and ``reward.txt``, ``reward.json``, ``ctrf.json`` where it wrote them whole."""


async def grade(sandbox: Sandbox, task: Task, *, harbor_verdict: bool = False) -> GradeResult:
    """Run the verifier once on the host's side, with fresh tests, and read its reward.

    ``harbor_verdict`` (evaluation): the verifier runs as in Harbor (a process that ran the agent's code may write
    the reward, the agent's pytest plugins load) and the findings list what training refuses (``Sandbox.verify``).

    Raises ``ResourcesExhausted`` when the agent's processes left no pid or memory to start the verifier with, or
    when the container hit its pids or memory limit while the verifier ran (a starved verifier proves nothing).
    """
    from terminus_env.sandbox import ResourcesExhausted

    start = time.monotonic()
    # Output goes to a file, not a pipe, so a process the verifier leaves behind cannot hold the run open. The test
    # script replaces the shell that starts it, so a signal that kills it is seen (the watch's runner_killed).
    command = f"exec bash {TESTS_DIR}/{task.verifier_script.name} > {TEST_STDOUT} 2>&1"
    run = await sandbox.verify(
        tests_archive(task), command, task.verifier_timeout_s,
        user=task.verifier_user or "root",  # not the agent's user: the verifier must see everything
        env=dict(task.verifier_env), read=(TEST_STDOUT, REWARD_TXT, REWARD_JSON, CTRF_REPORT),
        max_bytes=_LOG_READ_BYTES, harbor_verdict=harbor_verdict,
    )  # fmt: skip
    if run.limits_hit:
        raise ResourcesExhausted(f"the container hit its {' and '.join(run.limits_hit)} limit while the verifier ran")
    output = (run.files.get(TEST_STDOUT) or b"").decode("utf-8", "replace")
    duration = time.monotonic() - start
    files = _kept_files(output[-OUTPUT_CAP:], run.files)
    tampering = run.tampering
    if run.result.timed_out:
        timed_out = f"verifier timed out after {task.verifier_timeout_s:g}s"
        return GradeResult(0.0, output[-OUTPUT_CAP:], True, duration, timed_out, tampering=tampering, files=files)
    if task.source_format == "terminal-bench-1":
        reward, reason = pytest_reward(output)
    else:
        refused = refused_rewards(run.refused)
        if refused:  # no reward can be vouched for beside a reward file that is not the verifier's own
            reward, reason = 0.0, "; ".join(finding.detail for finding in refused)
            tampering = (*tampering, *refused)
        else:
            reward, reason = read_reward(run.files.get(REWARD_TXT), run.files.get(REWARD_JSON))
    # The first failing test: from the CTRF report if the verifier wrote one, else from its output.
    failure = first_failure(output, run.files.get(CTRF_REPORT))
    return GradeResult(reward, output[-OUTPUT_CAP:], False, duration, reason, failure, tampering, files)


def _kept_files(output: str, files: dict[str, bytes | None]) -> tuple[tuple[str, str], ...]:
    """What a run keeps of the verifier's files, as Harbor names them: the output, and the small files whole."""
    kept = [(VERIFIER_OUTPUT_NAME, output)] if output else []
    for path in (REWARD_TXT, REWARD_JSON, CTRF_REPORT):
        data = files.get(path)
        if data is not None and len(data) <= KEPT_FILE_CAP:
            kept.append((path.rsplit("/", 1)[1], data.decode("utf-8", "replace")))
    return tuple(kept)


def tests_archive(task: Task) -> bytes:
    """The tar the verifier's /tests is unpacked from: the tests folder (and Terminal-Bench 1's run-tests.sh)."""
    from terminus_env.sandbox.sandbox import tar_dir

    data = tar_dir(task.tests_dir, ".") if task.tests_dir.is_dir() else b""
    if task.source_format != "terminal-bench-1":
        return data
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        if data:
            with tarfile.open(fileobj=io.BytesIO(data)) as tests:
                for member in tests.getmembers():
                    archive.addfile(member, tests.extractfile(member) if member.isfile() else None)
        script = task.verifier_script.read_bytes()
        info = tarfile.TarInfo("run-tests.sh")
        info.size, info.mode, info.mtime = len(script), 0o755, int(time.time())
        archive.addfile(info, io.BytesIO(script))
    return buffer.getvalue()


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
        f"bash {SOLUTION_DIR}/{task.solution_path.name}", timeout=task.agent_time_limit_s, user=task.agent_user,
        env=task.solution_env,
    )


async def _prepare(sandbox: Sandbox, command: str) -> None:
    result = await sandbox.exec(command, timeout=_SETUP_TIMEOUT_S, user="root")
    if result.exit_code != 0 or result.timed_out:
        detail = result.output[-500:]
        raise TaskError(f"could not prepare the container for the reference solution ({command!r}): {detail}")


def read_reward(txt: bytes | None, json_data: bytes | None) -> tuple[float, str | None]:
    """reward.json wins over reward.txt, as Harbor 0.26's ``Verifier.verify`` reads them; neither is a reward of 0,
    with the reason."""
    if json_data is not None:
        return parse_reward_json(json_data)
    if txt is not None:
        return parse_reward_txt(txt)
    return 0.0, f"the verifier wrote neither {REWARD_TXT} nor {REWARD_JSON}"


def refused_rewards(refused: Mapping[str, str]) -> tuple[Finding, ...]:
    """A reward file the daemon would not read (a link, a FIFO, a folder: not a file the verifier wrote) as findings.

    Only a process in the verifier's tree can put one there, and an honest test script writes its reward as a plain
    file: a link to ``/dev/null`` would silence the test script's ``echo 0`` and leave the other reward file to
    decide. So the refusal is the grade's, whatever the other file holds: reward 0, reported as ``reward_forged``."""
    from terminus_env.sandbox.tamper import Finding, TamperKind

    return tuple(
        Finding(TamperKind.REWARD_FORGED, path, f"{path} is not a file the verifier wrote ({why}); no reward counts")
        for path, why in sorted(refused.items())
        if path in (REWARD_TXT, REWARD_JSON)
    )


def parse_reward_txt(data: bytes) -> tuple[float, str | None]:
    """reward.txt holds one decimal number in [0, 1], as JSON writes numbers (``1_0``, ``inf``, ``0x1`` are not)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    reward = None if text is None else read_decimal(text)
    if reward is None:
        return 0.0, f"{REWARD_TXT} does not hold a decimal number: {data[:100]!r}"
    return _in_range(reward, REWARD_TXT)


def parse_reward_json(data: bytes) -> tuple[float, str | None]:
    """reward.json is an object: its `reward` key, a finite number in [0, 1], whatever else the file holds beside it
    (counters such as ``"passed": 7``, as Harbor's verifiers write); without one, the mean of its values, each a
    number in [0, 1]."""
    try:
        values = json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return 0.0, f"{REWARD_JSON} is not valid JSON: {exc}"
    if not isinstance(values, dict) or not values:
        return 0.0, f"{REWARD_JSON} must be a non-empty object of numbers, not {data[:100]!r}"
    if "reward" in values:
        reward = values["reward"]
        if not _finite_number(reward):
            return 0.0, f"{REWARD_JSON}'s reward is not a finite number: {str(reward)[:100]!r}"
        return _in_range(float(reward), f"{REWARD_JSON}'s reward")
    if not all(_finite_number(v) for v in values.values()):
        return 0.0, f"{REWARD_JSON} has no reward key and holds values that are not finite numbers: {data[:100]!r}"
    for name, value in values.items():
        if not 0.0 <= value <= 1.0:
            return 0.0, f"{REWARD_JSON} value {name!r} is {value}, outside [0, 1]: counted as 0"
    return sum(values.values()) / len(values), None


def _finite_number(value: object) -> bool:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer too large for a float
        return False


def _in_range(reward: float, where: str) -> tuple[float, str | None]:
    if not 0.0 <= reward <= 1.0:
        return 0.0, f"{where} holds {reward:g}, outside [0, 1]: counted as 0"
    return reward, None


def pytest_reward(output: str) -> tuple[float, str | None]:
    """Terminal-Bench 1: resolved (1) when every pytest test passed, from the `-rA` lines of the last short test
    summary, or else the final counts."""
    outcomes = _PYTEST_OUTCOME.findall(_short_summary(output))
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


def _short_summary(output: str) -> str:
    """The section of pytest's last short test summary, up to the next rule; empty when there is none."""
    headers = list(_SUMMARY_HEADER.finditer(output))
    if not headers:
        return ""
    start = headers[-1].end()
    end = _SECTION_RULE.search(output, start)
    return output[start : end.start() if end else len(output)]


# --- the first failing test ----------------------------------------------------------------------

FAILURE_CAP = 300
"""Characters kept of the first failure (test name and assertion), cut at a word."""
_SUMMARY_LINE = re.compile(r"^(FAILED|ERROR) (\S+)(?: - (.*))?$", re.MULTILINE)
_SECTION_HEADER = re.compile(r"^_{3,} (?:ERROR at \w+ of |ERROR collecting )?(.+?) _{3,}$", re.MULTILINE)
_SECTION_END = re.compile(r"^(?:_{3,} .* _{3,}|={3,}.*)$", re.MULTILINE)
_ASSERTION_LINE = re.compile(r"^E {2,}(\S.*)$", re.MULTILINE)


def first_failure(output: str, ctrf: bytes | None = None) -> str | None:
    """The first failing test and its assertion, as ``"tests/test_x.py::test_y: AssertionError: ..."``.

    The CTRF report that most Terminal-Bench 2 verifiers write comes first; then pytest's short test
    summary, with the assertion taken from that test's section of the report, where pytest does not
    cut it to the terminal's width. None when neither names a failing test.
    """
    return (_ctrf_failure(ctrf) if ctrf else None) or _pytest_failure(output)


def _ctrf_failure(report: bytes) -> str | None:
    try:
        tests = json.loads(report)["results"]["tests"]
        failed = next((t for t in tests if isinstance(t, dict) and t.get("status") == "failed"), None)
    except (UnicodeDecodeError, ValueError, KeyError, TypeError):
        return None  # a missing or malformed report: fall back to the output
    if failed is None or not isinstance(failed.get("name"), str):
        return None
    message, trace = failed.get("message"), failed.get("trace")
    message = message if isinstance(message, str) else ""
    trace = trace if isinstance(trace, str) else ""
    assertion = _first_line(message) or _first_assertion(trace)
    return _clip(f"{failed['name']}: {assertion}" if assertion else failed["name"])


def _pytest_failure(output: str) -> str | None:
    summary = _SUMMARY_LINE.findall(output)
    chosen = next((s for s in summary if s[0] == "FAILED"), summary[0] if summary else None)
    if chosen is None:  # no short summary (e.g. `-p no:terminal`-style runs): the first failure section
        header = _SECTION_HEADER.search(output)
        if header is None:
            return None
        assertion = _first_assertion(_section(output, header))
        return _clip(f"{header.group(1)}: {assertion}" if assertion else header.group(1))
    _, node_id, short_message = chosen
    section_name = ".".join(node_id.split("::")[1:]) or node_id  # pytest's section title for this test
    header = next((h for h in _SECTION_HEADER.finditer(output) if h.group(1) == section_name), None)
    assertion = (_first_assertion(_section(output, header)) if header else None) or short_message
    return _clip(f"{node_id}: {assertion}" if assertion else node_id)


def _section(output: str, header: re.Match[str]) -> str:
    end = _SECTION_END.search(output, header.end())
    return output[header.end() : end.start() if end else len(output)]


def _first_assertion(text: str) -> str | None:
    match = _ASSERTION_LINE.search(text)
    return match.group(1).strip() if match else None


def _first_line(text: str) -> str | None:
    return next((line.strip() for line in text.splitlines() if line.strip()), None)


def _clip(text: str) -> str:
    """One line, at most FAILURE_CAP characters, cut between words."""
    text = " ".join(text.split())
    if len(text) <= FAILURE_CAP:
        return text
    cut = text.rfind(" ", 0, FAILURE_CAP)
    return text[: cut if cut > FAILURE_CAP // 2 else FAILURE_CAP - 1].rstrip() + "…"
