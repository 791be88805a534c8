"""Grading and the oracle on a real Docker engine, with hand-written tasks in both formats."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from terminus_env.cli.check import check_task, run_check
from terminus_env.tasks import Task, apply_oracle, find_task, grade, load_task, task_image

pytestmark = pytest.mark.usefixtures("docker_required")


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)

HARBOR_TEST = """#!/bin/bash
mkdir -p /logs/verifier
if [ "$(cat /app/out.txt 2>/dev/null)" = "hello" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
echo "checked by $CHECKER"
"""
TB1_TEST = """
from pathlib import Path


def test_marker_exists():
    assert Path("/app/done").exists()


def test_marker_content():
    assert Path("/app/done").read_text() == "yes\\n"
"""


def harbor_task(root: Path, *, solve: str | None = None) -> Path:
    folder = root / "tiny-harbor"
    write(folder / "task.toml", (
        "[agent]\ntimeout_sec = 60\n"
        "[verifier]\ntimeout_sec = 60\nenv = { CHECKER = \"the-verifier\" }\n"
        "[environment]\ncpus = 1\nmemory_mb = 512\nallow_internet = false\nworkdir = \"/app\"\n"
    ))  # fmt: skip
    write(folder / "instruction.md", "Write hello to /app/out.txt.\n")
    write(folder / "environment" / "Dockerfile", "FROM terminus-env/base:bookworm\nRUN mkdir -p /app\n")
    write(folder / "tests" / "test.sh", HARBOR_TEST)
    write(folder / "solution" / "solve.sh", solve or "cat /solution/answer.txt > /app/out.txt\n")
    write(folder / "solution" / "answer.txt", "hello\n")
    return folder


def tb1_task(root: Path) -> Path:
    folder = root / "tiny-tb1"
    write(folder / "task.yaml", "instruction: Create /app/done containing yes.\nmax_test_timeout_sec: 60\n")
    write(folder / "Dockerfile", "FROM terminus-env/base:bookworm\nRUN mkdir -p /app\n")
    run_tests = "#!/bin/bash\ncd $TEST_DIR && python3 -m pytest -p no:cacheprovider -rA test_outputs.py\n"
    write(folder / "run-tests.sh", run_tests)
    write(folder / "tests" / "test_outputs.py", TB1_TEST)
    write(folder / "solution.sh", "echo yes > /app/done\n")
    return folder


async def started(task: Task):  # noqa: ANN201 - a Sandbox, imported lazily like the package does
    from terminus_env.sandbox import Sandbox

    return await Sandbox.start(task.sandbox_spec(await task_image(task)))


def with_verifier(task: Task, root: Path, script: str, timeout: float | None = None) -> Task:
    """The same task (and image) with another tests/test.sh, so one container can be graded several ways."""
    tests = root / f"tests-{abs(hash(script))}"
    write(tests / "test.sh", script)
    changes = {"tests_dir": tests, "verifier_script": tests / "test.sh"}
    if timeout is not None:
        changes["verifier_timeout_s"] = timeout
    return dataclasses.replace(task, **changes)


def run(coro):  # noqa: ANN001, ANN201
    return asyncio.run(coro)


def test_harbor_oracle_earns_1_and_nothing_earns_0(tmp_path: Path) -> None:
    async def scenario() -> None:
        task = load_task(harbor_task(tmp_path))
        nothing, oracle = await started(task), await started(task)
        try:
            for sandbox in (nothing, oracle):  # /tests is an empty folder on the agent's side, for good
                probe = await sandbox.exec("test -e /solution || ls -A /tests", timeout=10)
                assert (probe.exit_code, probe.output) == (0, ""), "tests or solution visible before grading"
            applied = await apply_oracle(oracle, task)
            assert applied.exit_code == 0 and not applied.timed_out, applied.output
            good, bad = await grade(oracle, task), await grade(nothing, task)
            assert (good.reward, good.reason, good.timed_out) == (1.0, None, False)
            assert (bad.reward, bad.reason) == (0.0, None)
            assert "checked by the-verifier" in good.output  # the verifier env reached test.sh
            log = await oracle.read_file("/logs/verifier/test-stdout.txt")
            assert log is not None and b"checked by the-verifier" in log
        finally:
            await nothing.close()
            await oracle.close()

    run(scenario())


def test_tb1_oracle_earns_1_and_nothing_earns_0(tmp_path: Path) -> None:
    async def scenario() -> None:
        task = load_task(tb1_task(tmp_path))
        nothing, oracle = await started(task), await started(task)
        try:
            assert (await apply_oracle(oracle, task)).exit_code == 0
            good, bad = await grade(oracle, task), await grade(nothing, task)
            assert (good.reward, good.reason) == (1.0, None), good.output
            assert bad.reward == 0.0 and "2 of 2 tests failed" in (bad.reason or ""), bad.output
        finally:
            await nothing.close()
            await oracle.close()

    run(scenario())


@pytest.mark.parametrize(
    ("script", "reward", "reason"),
    [
        ("echo '{\"reward\": 0.25, \"style\": 1}' > /logs/verifier/reward.json", 0.25, None),
        ("echo '{\"a\": 1, \"b\": 0, \"c\": 0.5}' > /logs/verifier/reward.json", 0.5, None),
        ("echo '{\"a\": \"yes\"}' > /logs/verifier/reward.json", 0.0, "not finite numbers"),
        ("echo 'not json' > /logs/verifier/reward.json", 0.0, "not valid JSON"),
        ("echo ' 0.75 ' > /logs/verifier/reward.txt", 0.75, None),
        ("echo 'pass' > /logs/verifier/reward.txt", 0.0, "does not hold a decimal number"),
        ("echo 'no reward written'", 0.0, "neither /logs/verifier/reward.txt nor"),
    ],
)
def test_reward_files(tmp_path: Path, script: str, reward: float, reason: str | None) -> None:
    async def scenario() -> None:
        task = load_task(harbor_task(tmp_path))
        sandbox = await started(task)
        try:
            result = await grade(sandbox, with_verifier(task, tmp_path, script))
        finally:
            await sandbox.close()
        assert result.reward == reward
        assert (result.reason is None) if reason is None else (reason in (result.reason or ""))

    run(scenario())


def test_stale_reward_from_the_episode_is_ignored(tmp_path: Path) -> None:
    async def scenario() -> None:
        task = load_task(harbor_task(tmp_path))
        sandbox = await started(task)
        try:
            await sandbox.exec("mkdir -p /logs/verifier /tests && echo 1 > /logs/verifier/reward.txt", timeout=10)
            await sandbox.exec("echo 'echo 1 > /logs/verifier/reward.txt' > /tests/fake.sh", timeout=10)
            result = await grade(sandbox, with_verifier(task, tmp_path, "echo 'I write no reward'"))
            assert result.reward == 0.0 and "neither" in (result.reason or "")
            assert await sandbox.read_file("/tests/fake.sh") is None  # /tests holds only the task's tests
        finally:
            await sandbox.close()

    run(scenario())


def test_verifier_timeout(tmp_path: Path) -> None:
    async def scenario() -> None:
        task = load_task(harbor_task(tmp_path))
        sandbox = await started(task)
        try:
            slow = with_verifier(task, tmp_path, "echo 1 > /logs/verifier/reward.txt; sleep 60", timeout=2)
            result = await grade(sandbox, slow)
        finally:
            await sandbox.close()
        assert result.timed_out and result.reward == 0.0
        assert "timed out after 2s" in (result.reason or "")
        assert result.duration_s < 30

    run(scenario())


def test_grading_works_while_the_agent_left_a_command_running(tmp_path: Path) -> None:
    async def scenario() -> None:
        task = load_task(harbor_task(tmp_path))
        sandbox = await started(task)
        try:
            await sandbox.terminal.send("echo hello > /app/out.txt; sleep 1000\n", 0.5)
            result = await grade(sandbox, task)
        finally:
            await sandbox.close()
        assert result.reward == 1.0

    run(scenario())


def test_shipped_hello_world_passes_every_check() -> None:
    outcomes = run(check_task(find_task("hello-world").path, lambda _: None))
    assert [(o.check, o.reward, o.passed) for o in outcomes] == [
        ("nop", 0.0, True), ("oracle", 1.0, True), ("train-nop", 0.0, True), ("train-oracle", 1.0, True)
    ]  # fmt: skip


def test_check_names_an_oracle_flagged_as_tampering_in_train_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An oracle that adds a start-up hook to the verifier's Python earns 1 in a plain grade's reward, but
    train mode ends its episode `tampered`: the check fails it and names the finding and the path."""
    suite = tmp_path / "suite"
    hook = "/etc/python3.11/sitecustomize.py"  # what Debian's /usr/lib/python3.11/sitecustomize.py links to
    folder = harbor_task(suite, solve=f"cat /solution/answer.txt > /app/out.txt\necho 'import os' > {hook}\n")
    write(folder / "tests" / "test.sh", HARBOR_TEST.replace("mkdir -p /logs/verifier", "python3 -c 'print(1)'"))
    assert run_check(suite, concurrency=1) == 1
    out = capsys.readouterr().out
    flagged = [line for line in out.splitlines() if "FAIL train-oracle tiny-harbor" in line]
    assert len(flagged) == 1, out
    assert f"flagged as tampering in train mode: startup_hook {hook}" in flagged[0]
    assert any(line.startswith("[") and "ok   train-nop tiny-harbor  reward=0" in line for line in out.splitlines())


def test_check_fails_a_task_whose_oracle_does_not_solve_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    suite = tmp_path / "suite"
    harbor_task(suite, solve="echo 'forgot to write the file'\n")
    assert run_check(suite, concurrency=2) == 1
    out = capsys.readouterr().out
    assert "FAIL oracle tiny-harbor  reward=0" in out
    assert "0/1 tasks valid" in out


def test_check_passes_a_valid_suite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    suite = tmp_path / "suite"
    harbor_task(suite)
    tb1_task(suite)
    assert run_check(suite, concurrency=2) == 0
    out = capsys.readouterr().out
    assert "2/2 tasks valid" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("tiny-")]
    assert rows == [["tiny-harbor", "0", "1", "0", "1", "ok"], ["tiny-tb1", "0", "1", "0", "1", "ok"]]


def test_verifier_leaving_a_process_behind_does_not_hold_grading(tmp_path: Path) -> None:
    async def scenario() -> None:
        task = load_task(harbor_task(tmp_path))
        sandbox = await started(task)
        try:
            script = "sleep 300 & echo 1 > /logs/verifier/reward.txt; echo started a server"
            result = await grade(sandbox, with_verifier(task, tmp_path, script, timeout=20))
        finally:
            await sandbox.close()
        assert (result.reward, result.timed_out) == (1.0, False)
        assert "started a server" in result.output
        assert result.duration_s < 15

    run(scenario())


def test_non_root_verifier_can_write_its_reward(tmp_path: Path) -> None:
    async def scenario() -> None:
        task = load_task(harbor_task(tmp_path))
        sandbox = await started(task)
        try:
            script = "id -un; echo 0.5 > /logs/verifier/reward.txt"
            as_nobody = dataclasses.replace(with_verifier(task, tmp_path, script), verifier_user="nobody")
            result = await grade(sandbox, as_nobody)
        finally:
            await sandbox.close()
        assert (result.reward, result.reason) == (0.5, None)
        assert result.output.strip() == "nobody"

    run(scenario())


def test_agent_user_runs_the_episode_and_root_the_verifier(tmp_path: Path) -> None:
    async def scenario() -> None:
        task = dataclasses.replace(load_task(harbor_task(tmp_path)), agent_user="nobody")
        sandbox = await started(task)
        try:
            episode_user = (await sandbox.exec("id -un", timeout=10)).output.strip()
            result = await grade(sandbox, with_verifier(task, tmp_path, "id -un; echo 1 > /logs/verifier/reward.txt"))
        finally:
            await sandbox.close()
        assert episode_user == "nobody"
        assert (result.reward, result.output.strip()) == (1.0, "root")

    run(scenario())
