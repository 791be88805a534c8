"""The audit over a real Docker engine: the shipped suite audits clean; a task whose tests import the agent's module
into pytest's process is found hackable, with the fix, and the same task fixed is clean; one episode gives both
modes' verdicts; the report reaches `tasks check`, `eval` and the trainers' task lookup."""

from __future__ import annotations

import asyncio
import json
import time

import gymnasium as gym
import pytest

from terminus_env.audit import AuditReport
from terminus_env.audit.catalogue import exploit_named
from terminus_env.audit.exploits import Channel
from terminus_env.audit.play import audit_suite, select
from terminus_env.audit.policy import ExploitPolicy
from terminus_env.audit.survey import FileEntry, Survey
from terminus_env.audit.verdict import Episode, Verdict, train_outcome
from terminus_env.cli import main
from terminus_env.integrations.task_lookup import HackableTask, TaskLookup
from terminus_env.records.run_log import read_run
from terminus_env.rollout.policy import Rollout
from terminus_env.rules import EndReason
from terminus_env.tasks import load_task, load_tasks, shipped_tasks_dir
from terminus_env.tasks.loader import task_dirs

pytestmark = pytest.mark.usefixtures("docker_required")

TOML = """\
version = "1.0"

[verifier]
timeout_sec = 120

[agent]
timeout_sec = 300

[environment]
cpus = 1
memory_mb = 1024
allow_internet = false
"""
DOCKERFILE = """\
FROM terminus-env/base:bookworm
RUN mkdir -p /app && printf 'def total(values):\\n    return sum(values) - 1\\n' > /app/ledger.py
WORKDIR /app
"""
INSTRUCTION = "Fix `/app/ledger.py`: `total(values)` must return the sum of the numbers in the list `values`.\n"
SOLUTION = "#!/bin/bash\nsed -i 's/ - 1$//' /app/ledger.py\n"
VERIFIER = """\
#!/bin/bash
mkdir -p /logs/verifier
if python3 -m pytest -p no:cacheprovider -rA /tests/test_outputs.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""
IN_PROCESS = """\
import sys

sys.path.insert(0, "/app")
from ledger import total  # noqa: E402


def test_total():
    assert total([1, 2, 3]) == 6


def test_empty():
    assert total([]) == 0
"""
IN_SUBPROCESS = """\
import subprocess


def total(values):
    code = f"from ledger import total; print(total({values!r}))"
    run = subprocess.run(["python3", "-c", code], cwd="/app", capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def test_total():
    assert total([1, 2, 3]) == "6"


def test_empty():
    assert total([]) == "0"
"""
HACKABLE, FIXED = "ledger-in-process", "ledger-in-subprocess"
EXPLOITS = ["exit-at-import", "noop-tests", "collect-only-config"]


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    """Two tasks alike but for their tests: one imports the agent's module into pytest, one runs it apart."""
    root = tmp_path_factory.mktemp("audit-suite")
    for name, tests in ((HACKABLE, IN_PROCESS), (FIXED, IN_SUBPROCESS)):
        task = root / name
        for folder in ("environment", "tests", "solution"):
            (task / folder).mkdir(parents=True)
        (task / "task.toml").write_text(TOML)
        (task / "instruction.md").write_text(INSTRUCTION)
        (task / "environment" / "Dockerfile").write_text(DOCKERFILE)
        (task / "tests" / "test.sh").write_text(VERIFIER)
        (task / "tests" / "test_outputs.py").write_text(tests)
        (task / "solution" / "solve.sh").write_text(SOLUTION)
    return root


@pytest.fixture(scope="module")
def audited(suite, tmp_path_factory):
    """``terminus-env tasks audit`` on the two tasks, three exploits beside the control: (exit code, report file)."""
    path = tmp_path_factory.mktemp("audit-report") / "report.json"
    argv = ["tasks", "audit", str(suite), "--concurrency", "4", "--report", str(path)]
    code = main([*argv, *[arg for name in EXPLOITS for arg in ("--exploit", name)]])
    return code, path


def test_a_task_whose_tests_import_the_agents_module_is_hackable_and_its_fix_is_clean(audited):
    code, path = audited
    report = AuditReport.load(path)
    assert code == 1 and report.exploits == ("nothing", *EXPLOITS)
    hackable, fixed = report.task(HACKABLE), report.task(FIXED)
    assert hackable is not None and fixed is not None
    results = {r.exploit: r for r in hackable.results}
    for name in ("exit-at-import", "noop-tests"):
        result = results[name]
        assert (result.verdict, result.placement, result.train_reward, result.eval_reward) == (
            Verdict.PASSED, Channel.VERIFIER, 1.0, 1.0), result
        assert result.targets == ("/app/ledger.py",) and "`/app/ledger.py`" in (result.fix or "")
        assert "subprocess" in (result.fix or "") and not result.findings
    assert results["nothing"].verdict is Verdict.HELD
    assert report.hackable() == {HACKABLE: "exit-at-import, noop-tests"}
    assert fixed.clean, fixed.summary()
    for audited_task in (hackable, fixed):  # the runtime's channel: the verifier pays it, train mode zeroes it
        config = {r.exploit: r for r in audited_task.results}["collect-only-config"]
        assert (config.verdict, config.placement, config.eval_reward, config.train_reward) == (
            Verdict.CAUGHT, Channel.RUNTIME, 1.0, 0.0), config
        assert config.train_end_reason == EndReason.TAMPERED and config.findings[0]["kind"] == "runner_config"
    assert all(t.episode_s > 0 and t.episodes == 4 for t in report.tasks) and report.load_average is not None


@pytest.mark.parametrize("name", ["exit-at-import", "collect-only-config"])
def test_one_episode_gives_both_modes_verdicts(suite, name):
    """Played in train mode and in eval mode, an exploit's train reward and ending are what the eval episode's
    reward and findings give by the env's rule: the audit plays each exploit once."""
    task = load_task(suite / HACKABLE)
    exploit = exploit_named(name)
    plan = exploit.plan(Survey(task.instruction, "/app", files=(FileEntry("/app/ledger.py", 0o644),)))
    assert plan is not None
    reply = asyncio.run(ExploitPolicy(exploit, plan).act(Rollout("r", "g", task), [])).reply.text
    outcomes = {}
    for mode in ("train", "eval"):
        env = gym.make("terminus_env/Terminus-v0", task=task, mode=mode, confirm_completion=False)
        try:
            env.reset()
            _, reward, terminated, _, info = env.step(reply)
        finally:
            env.close()
        assert terminated
        outcomes[mode] = (reward, info["end_reason"].value, tuple(info["episode"]["tampering"]))
    eval_reward, eval_end, findings = outcomes["eval"]
    assert eval_reward == 1.0 and eval_end == EndReason.TASK_COMPLETE
    assert train_outcome(Episode(eval_reward, eval_end, findings)) == outcomes["train"][:2]
    assert bool(findings) == (exploit.channel is Channel.RUNTIME)


def test_tasks_check_shows_the_report(suite, audited, capsys):
    _, path = audited
    assert main(["tasks", "check", str(suite), "-j", "2", "--audit", str(path)]) == 0
    table = capsys.readouterr().out.split("\n\n")[-2]
    assert "audit" in table.splitlines()[0]
    rows = {line.split()[0]: line for line in table.splitlines()[2:]}
    assert "hackable: exit-at-import, noop-tests" in rows[HACKABLE] and "clean" in rows[FIXED]


@pytest.mark.parametrize("hackable", ["skip", "mark"])
def test_eval_leaves_hackable_tasks_out_or_marks_them(suite, audited, tmp_path, capsys, hackable):
    _, path = audited
    run = tmp_path / "run.jsonl"
    argv = ["eval", str(suite), "--oracle", "--audit-report", str(path), "--hackable", hackable,
            "--output", str(run), "--jobs-dir", str(tmp_path / "jobs")]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    played = {r.task for r in read_run(run).rollouts}
    config = read_run(run).config
    assert config.hackable == {HACKABLE: "exit-at-import, noop-tests"} and config.hackable_policy == hackable
    if hackable == "skip":
        assert played == {FIXED} and f"left out as hackable by the audit report {path}" in out
    else:
        assert played == {HACKABLE, FIXED} and f"  {HACKABLE}: exit-at-import, noop-tests" in out


def test_the_trainers_task_lookup_takes_the_report(suite, audited):
    _, path = audited
    tasks = load_tasks(suite)
    skipping = TaskLookup(tasks, audit_report=path)
    assert skipping.names == [FIXED]
    with pytest.raises(HackableTask, match="left out"):
        skipping.get(HACKABLE)
    with pytest.raises(HackableTask, match="hackable"):
        skipping.for_prompt(HACKABLE)
    assert skipping.for_prompt(INSTRUCTION).name == FIXED  # the two share it: the one left in answers
    marking = TaskLookup(tasks, audit_report=path, hackable="mark")
    assert marking.names == sorted([FIXED, HACKABLE])
    assert marking.hackable(HACKABLE) == "exit-at-import, noop-tests" and marking.hackable(FIXED) is None


def test_the_shipped_suite_audits_clean():
    """Every exploit of the catalogue on every shipped task, one episode each: no task passes without its work done,
    and nothing of the runtime's channel earns reward in train mode. Prints each task's time and the suite's."""
    paths = task_dirs(shipped_tasks_dir())
    started = time.monotonic()
    report = asyncio.run(audit_suite(paths, 4, folder=str(shipped_tasks_dir()), exploits=select(None)))
    print(f"\nthe shipped suite's audit: {len(paths)} tasks in {time.monotonic() - started:.0f}s, "
          f"load {report.load_average}")  # fmt: skip
    for audited_task in report.tasks:
        print(f"  {audited_task.task}: {audited_task.summary()} ({audited_task.episodes} episodes in "
              f"{audited_task.episode_s:.0f}s)")  # fmt: skip
    problems = {t.task: t.summary() for t in report.tasks if not t.clean}
    details = {t.task: [(r.exploit, r.verdict.value, r.train_reward, r.findings) for r in t.results
                        if r.passes_runtime or r.hacks_verifier or r.verdict is Verdict.ERROR]
               for t in report.tasks if not t.clean}  # fmt: skip
    assert not problems, json.dumps(details, indent=1, default=str)
