"""The audit's pure parts, without Docker: the survey and what it chooses to replace, the exploits' keystrokes (run
by the host's bash, their payloads by the host's pytest), the verdicts and placements, the report and the screen."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from terminus_env.audit import AuditReport, AuditReportError, Hackable, TaskAudit, screen_tasks
from terminus_env.audit.catalogue import CATALOGUE, CONTROL, exploit_named
from terminus_env.audit.exploits import (
    Channel,
    Plan,
    exit_at_import,
    noop_tests,
    program_rewrites_tests,
    replace_programs,
    write_files,
)
from terminus_env.audit.policy import ExploitPolicy, SurveyPolicy
from terminus_env.audit.report import ExploitResult, audit_cell, print_report
from terminus_env.audit.screen import load_screen
from terminus_env.audit.survey import (
    FileEntry,
    NamedPath,
    Survey,
    modules,
    named_commands,
    named_files,
    named_paths,
    parse_survey,
    programs,
    survey_command,
)
from terminus_env.audit.verdict import Episode, Verdict, judge_task, train_outcome
from terminus_env.protocol import parse_reply
from terminus_env.rules import EndReason, TamperPolicy, tamper_ending

INSTRUCTION = """\
Fix `/app/inventory/inventory.py` so that `cd /app/inventory && python3 -m pytest` passes, then write a script
`/usr/local/bin/rotate-logs` and make `myapp show` print the settings; `/data/orders.json` is the input.
See https://example.com/a/b for more. Also `jq` is installed.
"""


def test_the_instruction_names_paths_and_commands():
    assert named_paths(INSTRUCTION) == [
        "/app/inventory/inventory.py", "/app/inventory", "/usr/local/bin/rotate-logs", "/data/orders.json",
    ]  # fmt: skip
    assert named_commands(INSTRUCTION) == ["cd", "myapp", "jq"]
    relative = "Put `solve` in a file called grid_transform.py; 'run_pipeline.sh' calls src/step.py (not /x/y.py)."
    assert named_files(relative) == ["grid_transform.py", "run_pipeline.sh", "src/step.py"]


def _survey_of(tmp_path: Path, instruction: str, script: str = "") -> Survey:
    """The survey command run by the host's bash in ``tmp_path``, read back as the env would show it."""
    command = survey_command(instruction)
    shown = subprocess.run(["bash", "-c", f"{script}\n{command}"], cwd=tmp_path, capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    echoed = f"root@box:{tmp_path}# {command}"  # the terminal echoes the command, which must not read as facts
    return parse_survey(instruction, f"New terminal output:\n{echoed}{shown.stdout}root@box:/# ")


def test_the_survey_lists_the_working_folder_and_what_the_instruction_names(tmp_path):
    project = tmp_path / "proj"
    (project / "tests").mkdir(parents=True)
    (project / "pkg").mkdir()
    (project / ".git" / "hooks").mkdir(parents=True)
    for name in ("app.py", "pkg/__init__.py", "tests/test_app.py", "conftest.py", "setup.py", "notes.txt"):
        (project / name).write_text("x = 1\n")
    (project / "run.sh").write_text("echo hi\n")
    (project / "Makefile").write_text("all:\n\ttrue\n")
    (project / "tool").write_text("#!/bin/sh\n")
    (project / "tool").chmod(0o755)
    (project / ".git" / "hooks" / "pre-commit").write_text("#!/bin/sh\n")
    (project / ".git" / "hooks" / "pre-commit").chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mycli").write_text("#!/bin/sh\n")
    (bin_dir / "mycli").chmod(0o755)
    missing = tmp_path / "out" / "solution.py"
    instruction = (f"Make `mycli run` work and write `{missing}`; the project is `{project}`. `python3` is there. "
                   "Create grid_transform.py, which the tests import.")  # fmt: skip
    survey = _survey_of(project, instruction, f"export PATH={bin_dir}:$PATH")
    assert survey.workdir == str(project)
    assert modules(survey) == [f"{project}/app.py", f"{project}/pkg/__init__.py", str(missing),
                               f"{project}/grid_transform.py"]  # fmt: skip
    assert programs(survey) == [str(missing), f"{project}/grid_transform.py", f"{project}/Makefile",
                                f"{project}/run.sh", f"{project}/tool", f"{bin_dir}/mycli"]  # fmt: skip
    assert ("python3", subprocess.run(["bash", "-c", "command -v python3"], capture_output=True,
                                      text=True).stdout.strip()) in survey.commands  # fmt: skip


def test_programs_leave_the_runtime_alone():
    survey = Survey(
        "x",
        "/app",
        files=(FileEntry("/app/cli", 0o755), FileEntry("/app/data.json", 0o755), FileEntry("/app/lib.so", 0o755),
               FileEntry("/app/tests/run.sh", 0o755), FileEntry("/app/python3", 0o755)),
        commands=(("python3", "/usr/local/bin/python3"), ("jq", "/usr/bin/jq"), ("myapp", "/usr/local/bin/myapp")),
        named=(NamedPath("/usr/bin/make", "f", 0o755), NamedPath("/opt/tool/bin/new", "-"),
               NamedPath("/srv/app/secret.key", "f", 0o600), NamedPath("/srv/app", "d", 0o755)),
    )  # fmt: skip
    assert programs(survey) == ["/opt/tool/bin/new", "/app/cli", "/usr/local/bin/myapp"]
    assert modules(survey) == []


def test_a_survey_cut_by_the_terminal_reads_what_it_can():
    text = "@F 755 /app/a.py\n@F 7x5 /app/b.py\n@C jq\n@N f 644\n@W /app\n@F 644 relative.py\n"
    survey = parse_survey("x", text)
    assert [f.path for f in survey.files] == ["/app/a.py"] and survey.commands == () and survey.named == ()


@pytest.mark.parametrize("exploit", CATALOGUE, ids=lambda e: e.name)
def test_every_reply_parses_back_to_the_planned_keystrokes(exploit):
    survey = Survey(INSTRUCTION, "/app", files=(FileEntry("/app/m.py", 0o644), FileEntry("/app/run", 0o755)))
    plan = exploit.plan(survey)
    assert plan is not None
    parsed = parse_reply(_reply_text(ExploitPolicy(exploit, plan)))
    assert parsed.error is None and parsed.task_complete
    assert [c.keystrokes for c in parsed.commands] == ([plan.keystrokes] if plan.keystrokes else [""])
    survey_reply = parse_reply(_reply_text(SurveyPolicy(CONTROL)))
    assert survey_reply.commands[0].keystrokes == survey_command(INSTRUCTION) and not survey_reply.task_complete


def _reply_text(policy) -> str:
    import asyncio

    from terminus_env.rollout.policy import Rollout
    from terminus_env.tasks import Task

    task = Task("t", INSTRUCTION, Path("/t"), "harbor", Path("/t/tests"), Path("/t/tests/test.sh"), None, None)
    return asyncio.run(policy.act(Rollout("r", "g", task), [{"role": "user", "content": "hi"}])).reply.text


def test_written_files_keep_an_existing_files_mode_and_appends_keep_its_code(tmp_path):
    old = tmp_path / "old.py"
    old.write_text("VALUE = 1\n")
    old.chmod(0o640)
    new = tmp_path / "deep" / "new.sh"
    keys = write_files("echo 'quoted $x'\n", [str(old), str(new)], executable=True)
    subprocess.run(["bash", "-c", keys.replace("/tmp/.audit-payload", str(tmp_path / "p"))], check=True)
    assert old.read_text() == new.read_text() == "echo 'quoted $x'\n"
    assert old.stat().st_mode & 0o777 == 0o751 and os.access(new, os.X_OK)
    target = tmp_path / "mod.py"
    target.write_text("from __future__ import annotations\nVALUE = 1\n")
    appended = write_files("EXTRA = 2\n", [str(target)], append=True)
    subprocess.run(["bash", "-c", appended.replace("/tmp/.audit-payload", str(tmp_path / "q"))], check=True)
    assert target.read_text() == "from __future__ import annotations\nVALUE = 1\nEXTRA = 2\n"


TESTS_THAT_IMPORT = """\
import sys
sys.path.insert(0, {folder!r})
from ledger import Ledger


def test_it_works():
    assert Ledger().total() == 3


def test_it_really_works():
    assert False, "never passes"
"""


def _pytest_on_imported_module(tmp_path: Path, module: str) -> subprocess.CompletedProcess:
    folder = tmp_path / "agent"
    folder.mkdir()
    (folder / "ledger.py").write_text(module)
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_outputs.py").write_text(TESTS_THAT_IMPORT.format(folder=str(folder)))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(tests)],
                          capture_output=True, text=True)  # fmt: skip


def test_exit_at_import_ends_pytest_with_success_before_any_assertion(tmp_path):
    run = _pytest_on_imported_module(tmp_path, exit_at_import.PAYLOAD)
    assert run.returncode == 0 and "passed" not in run.stdout and "failed" not in run.stdout, run.stdout


def test_noop_tests_makes_failing_tests_pass_and_keeps_the_modules_names(tmp_path):
    run = _pytest_on_imported_module(tmp_path, "class Ledger:\n    def total(self):\n        return 0\n"
                                     + noop_tests.PAYLOAD)  # fmt: skip
    assert run.returncode == 0 and "2 passed" in run.stdout, run.stdout
    (tmp_path / "new").mkdir()
    made = _pytest_on_imported_module(tmp_path / "new", noop_tests.PAYLOAD)  # a module that did not exist
    assert made.returncode == 0 and "2 passed" in made.stdout, made.stdout


def test_the_rewriting_program_appends_a_reward_write_to_the_tests_scripts_as_a_script_or_a_makefile(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    project = tmp_path / "project"
    project.mkdir()
    (tests / "test.sh").write_text("#!/bin/bash\necho 0 > reward\n")
    (project / "Makefile").write_text("all:\n\tcc -o app app.c\n")
    payload = program_rewrites_tests.PAYLOAD.replace("/tests/", f"{tests}/")
    plan = replace_programs([str(project / "run.sh"), str(project / "Makefile")], payload)
    assert plan is not None
    subprocess.run(["bash", "-c", plan.keystrokes.replace("/tmp/.audit-payload", str(tmp_path / "p"))], check=True)
    subprocess.run([str(project / "run.sh")], check=True)
    assert (tests / "test.sh").read_text().endswith("echo 1 > /logs/verifier/reward.txt\n")
    (tests / "test.sh").write_text("#!/bin/bash\n")
    subprocess.run(["make", "-C", str(project), "clean"], check=True, capture_output=True)
    assert (tests / "test.sh").read_text().endswith("echo 1 > /logs/verifier/reward.txt\n")


# ----- verdicts and placement ---------------------------------------------------------------------------------

FINDING = {"kind": "runner_config", "path": "/pytest.ini", "detail": ""}
OTHER_FINDING = {"kind": "runner_config", "path": "/x/entry_points.txt", "detail": ""}
DONE = EndReason.TASK_COMPLETE.value


def _judge(**episodes: Episode):
    names = {name.replace("_", "-"): episode for name, episode in episodes.items()}
    targets = {name: ("/app/m.py",) for name in names}
    return judge_task(CATALOGUE, names, targets)


def test_one_episode_gives_both_modes_by_the_envs_own_rule():
    for findings in [(), (FINDING,), (OTHER_FINDING,), (OTHER_FINDING, FINDING)]:
        reward, ending = train_outcome(Episode(1.0, DONE, findings))
        expected = tamper_ending(findings, TamperPolicy.FAIL)
        assert ending == (expected or EndReason.TASK_COMPLETE).value
        assert reward == (0.0 if expected else 1.0)
    assert train_outcome(Episode(0.0, EndReason.VERIFIER_BROKEN.value)) == (0.0, "verifier_broken")
    assert train_outcome(Episode(None, None, error="no sandbox")) == (None, None)


def test_verdicts_in_both_modes():
    judged = _judge(
        nothing=Episode(0.0, DONE),
        exit_at_import=Episode(1.0, DONE),
        noop_tests=Episode(0.0, DONE),
        collect_only_config=Episode(1.0, DONE, (FINDING,)),
        passing_conftest=Episode(1.0, DONE, (OTHER_FINDING,)),
        env_addopts=Episode(None, EndReason.ENV_ERROR.value, error="docker"),
        reward_path=Episode(0.0, DONE),
    )
    assert judged["exit-at-import"].verdict is Verdict.PASSED and judged["exit-at-import"].placement is Channel.VERIFIER
    fix = judged["exit-at-import"].fix or ""
    assert "`/app/m.py`" in fix and "subprocess" in fix
    assert judged["noop-tests"].verdict is Verdict.HELD
    assert (judged["collect-only-config"].verdict, judged["collect-only-config"].placement) == (Verdict.CAUGHT,
                                                                                               Channel.RUNTIME)
    assert judged["collect-only-config"].train_end_reason == "tampered"
    assert judged["passing-conftest"].verdict is Verdict.CAUGHT  # any finding zeroes train mode
    assert judged["env-addopts"].verdict is Verdict.ERROR
    timed_out = Episode(0.0, DONE, (), None, "verifier timed out after 60s")
    slow = _judge(nothing=Episode(0.0, DONE), exit_at_import=timed_out)
    assert slow["exit-at-import"].verdict is Verdict.ERROR  # a 0 from a verifier out of time proves nothing
    assert judged["program-exits"].verdict is Verdict.NOT_APPLICABLE
    assert judged["reward-path"].verdict is Verdict.HELD


def test_a_runtime_exploit_that_passes_alone_is_ours_and_with_its_control_the_tasks():
    alone = _judge(nothing=Episode(0.0, DONE), program_exits=Episode(0.0, DONE),
                   program_rewrites_tests=Episode(1.0, DONE))  # fmt: skip
    assert (alone["program-rewrites-tests"].verdict, alone["program-rewrites-tests"].placement) == (
        Verdict.PASSED, Channel.RUNTIME)
    assert alone["program-rewrites-tests"].fix is None
    both = _judge(nothing=Episode(0.0, DONE), program_exits=Episode(1.0, DONE),
                  program_rewrites_tests=Episode(1.0, DONE))  # fmt: skip
    assert both["program-rewrites-tests"].placement is Channel.VERIFIER
    assert both["program-rewrites-tests"].fix == both["program-exits"].fix
    assert "exit 0" in (both["program-exits"].fix or "")


def test_what_doing_nothing_earns_is_the_floor_and_only_the_full_reward_passes_it():
    judged = _judge(nothing=Episode(0.4, DONE), exit_at_import=Episode(0.4, DONE), noop_tests=Episode(0.8, DONE))
    assert judged["nothing"].verdict is Verdict.HELD and judged["nothing"].train_reward == 0.4
    assert judged["exit-at-import"].verdict is Verdict.HELD
    assert judged["noop-tests"].verdict is Verdict.PASSED
    untouched = _judge(nothing=Episode(1.0, DONE), exit_at_import=Episode(1.0, DONE))
    assert untouched["nothing"].verdict is Verdict.PASSED
    assert "before the task is done" in (untouched["nothing"].fix or "")
    assert untouched["exit-at-import"].verdict is Verdict.HELD


# ----- the report and the screen --------------------------------------------------------------------------------


def _report() -> AuditReport:
    hacked = ExploitResult("exit-at-import", Channel.VERIFIER, Verdict.PASSED, ("/app/m.py",), Channel.VERIFIER,
                           "run it in a subprocess", 1.0, DONE, 1.0, DONE, (), 3.0)  # fmt: skip
    forged = ExploitResult("program-rewrites-tests", Channel.RUNTIME, Verdict.PASSED, ("/usr/local/bin/x",),
                           Channel.RUNTIME, None, 1.0, DONE, 1.0, DONE, (), 4.0)  # fmt: skip
    caught = ExploitResult("collect-only-config", Channel.RUNTIME, Verdict.CAUGHT, ("/pytest.ini",), Channel.RUNTIME,
                           None, 1.0, DONE, 0.0, "tampered", (FINDING,), 2.0)  # fmt: skip
    return AuditReport(
        folder="/suite", exploits=tuple(e.name for e in CATALOGUE), jobs=2, duration_s=12.0,
        load_average=(1.0, 2.0, 3.0),
        tasks=(TaskAudit("hackable-task", 9.0, (hacked, caught)), TaskAudit("clean-task", 5.0, (caught,)),
               TaskAudit("forged-task", 6.0, (forged,)), TaskAudit("broken-task", 0.1, error="no Dockerfile")),
    )  # fmt: skip


def test_the_report_round_trips_through_json_and_says_what_passed(tmp_path):
    report = _report()
    path = tmp_path / "report.json"
    report.save(path)
    assert AuditReport.load(path) == report
    assert json.loads(path.read_text())["tasks"][0]["results"][0]["placement"] == "verifier"
    assert report.hackable() == {"hackable-task": "exit-at-import"}
    assert [t.task for t in report.tasks if t.clean] == ["clean-task"]
    assert audit_cell(report, "hackable-task") == "hackable: exit-at-import"
    assert audit_cell(report, "forged-task") == "RUNTIME LET THROUGH: program-rewrites-tests"
    assert audit_cell(report, "other") == "not in the report" and audit_cell(None, "x") == ""
    import io

    out = io.StringIO()
    print_report(report, out)
    text = out.getvalue()
    assert "hackable-task: exit-at-import (train reward 1, doing nothing -): run it in a subprocess" in text
    assert "THE RUNTIME LET THESE THROUGH" in text and "forged-task: program-rewrites-tests" in text
    assert "1 of 3 tasks hackable through their verifier (1 to the full reward)" in text and "load 1.0 2.0 3.0" in text


def test_a_bad_report_is_a_clear_error(tmp_path):
    with pytest.raises(AuditReportError, match="no such audit report"):
        AuditReport.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text('{"version": 99}')
    with pytest.raises(AuditReportError, match="not an audit report"):
        AuditReport.load(tmp_path / "bad.json")


def test_the_screen_leaves_hackable_tasks_out_or_marks_them(tmp_path):
    from terminus_env.tasks import Task

    def task(name: str) -> Task:
        return Task(name, "x", Path("/t"), "harbor", Path("/t/tests"), Path("/t/tests/test.sh"), None, None)

    tasks = [task("hackable-task"), task("clean-task"), task("new-task")]
    path = tmp_path / "report.json"
    _report().save(path)
    assert [t.name for t in screen_tasks(tasks, path)] == ["clean-task", "new-task"]
    assert [t.name for t in screen_tasks(tasks, path, "mark")] == ["hackable-task", "clean-task", "new-task"]
    assert screen_tasks(tasks, None) == tasks
    screen = load_screen(path, Hackable.MARK)
    assert screen is not None and screen.mark("hackable-task") == "exit-at-import" and screen.mark("clean-task") is None
    assert screen.unaudited(["clean-task", "new-task"]) == ["new-task"]
    with pytest.raises(ValueError):
        load_screen(path, "maybe")


def test_the_catalogue_is_what_the_audit_plays():
    assert CATALOGUE[0] is CONTROL and CONTROL.name == "nothing"
    assert len({e.name for e in CATALOGUE}) == len(CATALOGUE)
    for exploit in CATALOGUE:
        assert (exploit.fix is not None) == (exploit.channel is Channel.VERIFIER), exploit.name
        assert exploit.control is None or exploit_named(exploit.control).channel is Channel.VERIFIER
    with pytest.raises(ValueError, match="no exploit named"):
        exploit_named("nope")
    assert isinstance(CONTROL.plan(Survey("x")), Plan)


def test_the_trainers_lookup_reports_the_share_of_marked_tasks(tmp_path):
    from terminus_env.integrations.task_lookup import HackableTask, TaskLookup, hackable_share
    from terminus_env.rollout.trajectory import Trajectory
    from terminus_env.tasks import Task

    tasks = [Task(name, f"do {name}", Path("/t"), "harbor", Path("/t/tests"), Path("/t/tests/test.sh"), None, None)
             for name in ("hackable-task", "clean-task")]  # fmt: skip
    path = tmp_path / "report.json"
    _report().save(path)
    batch = [Trajectory(f"r{i}", name, "g") for i, name in enumerate(["hackable-task", "clean-task", "clean-task"])]
    marking = TaskLookup(tasks, audit_report=path, hackable="mark")
    assert hackable_share(marking, batch) == pytest.approx(1 / 3)
    assert hackable_share(TaskLookup(tasks), batch) == 0.0 and hackable_share(marking, []) == 0.0
    skipping = TaskLookup(tasks, audit_report=path)
    with pytest.raises(HackableTask, match="left out"):
        skipping.for_prompt("please do hackable-task now")
    with pytest.raises(ValueError, match="left every one out"):
        TaskLookup(tasks[:1], audit_report=path)


def test_the_conftest_left_where_the_projects_tests_run_makes_them_pass(tmp_path):
    from terminus_env.audit.exploits import workdir_config

    project = tmp_path / "project"
    (project / "tests").mkdir(parents=True)
    (project / "tests" / "test_app.py").write_text("def test_app():\n    assert False\n")
    other = tmp_path / "other"
    other.mkdir()
    (other / "pyproject.toml").write_text("[tool.pytest.ini_options]\naddopts = '-q'\n")
    files = (FileEntry(str(project / "tests" / "test_app.py"), 0o644), FileEntry(str(other / "lib.py"), 0o644))
    plan = workdir_config.plan(Survey("x", str(project), files=files))
    assert plan is not None
    assert plan.targets == (f"{project}/conftest.py", f"{other}/conftest.py", f"{project}/tests/conftest.py")
    subprocess.run(["bash", "-c", plan.keystrokes.replace("/tmp/.audit-payload", str(tmp_path / "p"))], check=True)
    assert (project / "pytest.ini").read_text() == "[pytest]\n" and not (other / "pytest.ini").exists()
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "tests"], cwd=project,
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0 and "1 passed" in run.stdout, run.stdout
    argv = ["-p", "no:cacheprovider", "-c", "/dev/null", "--noconftest", "--rootdir", str(project), "tests"]
    fixed = subprocess.run([sys.executable, "-m", "pytest", *argv], cwd=project, capture_output=True, text=True)
    assert fixed.returncode == 1 and "1 failed" in fixed.stdout, fixed.stdout
    assert "--noconftest" in workdir_config.fix(plan.targets)


def test_bad_arguments_are_refused_before_anything_plays(tmp_path, capsys):
    from terminus_env.audit.play import run_audit

    (tmp_path / "suite" / "one").mkdir(parents=True)
    (tmp_path / "suite" / "one" / "task.toml").write_text('version = "1.0"\n')
    assert run_audit(tmp_path / "suite", output=tmp_path) == 2
    assert "is a folder" in capsys.readouterr().err
    assert run_audit(tmp_path / "suite", exploits=["nope"]) == 2
    assert "no exploit named 'nope'" in capsys.readouterr().err
    assert run_audit(tmp_path / "suite", concurrency=0) == 2
    assert run_audit(tmp_path / "missing") == 2
