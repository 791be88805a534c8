"""Loading Harbor and Terminal-Bench 1 task folders, without Docker."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from terminus_env.tasks import Task, TaskError, find_task, load_task, load_tasks, shipped_tasks_dir

HARBOR_TOML = """
version = "1.0"

[task]
name = "org/demo"
description = "a demo"

[metadata]
difficulty = "easy"
category = "files"
tags = ["a", "b"]

[agent]
timeout_sec = 300
user = "agent"

[verifier]
timeout_sec = 90
user = "root"
env = { STRICT = "1", LEVEL = 3 }

[environment]
build_timeout_sec = 120
cpus = 1
memory_mb = 2048
storage_mb = 4096
allow_internet = false
workdir = "/app"
env = { APP_MODE = "test" }
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def harbor_task(root: Path, toml: str = HARBOR_TOML, name: str = "demo") -> Path:
    folder = root / name
    write(folder / "task.toml", toml)
    write(folder / "instruction.md", "Write hello to /app/out.txt.\n")
    write(folder / "environment" / "Dockerfile", "FROM terminus-env/base:bookworm\n")
    write(folder / "tests" / "test.sh", "echo 1 > /logs/verifier/reward.txt\n")
    write(folder / "solution" / "solve.sh", "echo hello > /app/out.txt\n")
    return folder


def tb1_task(root: Path, yaml_text: str | None = None, name: str = "legacy") -> Path:
    folder = root / name
    write(folder / "task.yaml", yaml_text or (
        "instruction: |\n  Create /app/done.\n"
        "difficulty: medium\ncategory: system\ntags: [files]\nparser_name: pytest\n"
        "max_agent_timeout_sec: 200\nmax_test_timeout_sec: 30\nrun_tests_in_same_shell: false\n"
        "author_email: someone@example.com\nexpert_time_estimate_min: 5\n"
    ))  # fmt: skip
    write(folder / "Dockerfile", "FROM terminus-env/base:bookworm\n")
    write(folder / "run-tests.sh", "python3 -m pytest -rA $TEST_DIR/test_outputs.py\n")
    write(folder / "tests" / "test_outputs.py", "def test_done():\n    assert True\n")
    write(folder / "solution.sh", "touch /app/done\n")
    return folder


def test_harbor_fields(tmp_path: Path) -> None:
    task = load_task(harbor_task(tmp_path))
    assert isinstance(task, Task)
    assert (task.name, task.source_format) == ("demo", "harbor")
    assert task.instruction == "Write hello to /app/out.txt.\n"
    assert (task.agent_timeout_s, task.verifier_timeout_s, task.build_timeout_s) == (300, 90, 120)
    assert (task.cpus, task.memory_mb, task.storage_mb) == (1.0, 2048, 4096)
    assert task.allow_internet is False
    assert dict(task.env) == {"APP_MODE": "test"} and task.workdir == "/app"
    assert dict(task.verifier_env) == {"STRICT": "1", "LEVEL": "3"}
    assert (task.agent_user, task.verifier_user) == ("agent", "root")
    assert task.build_context == tmp_path / "demo" / "environment"
    assert task.verifier_script == tmp_path / "demo" / "tests" / "test.sh"
    assert task.solution_path == tmp_path / "demo" / "solution" / "solve.sh"
    assert (task.difficulty, task.category) == ("easy", "files")
    assert task.metadata["tags"] == ["a", "b"]
    assert task.metadata["task"]["name"] == "org/demo"
    assert task.notes == ()


def test_harbor_defaults(tmp_path: Path) -> None:
    task = load_task(harbor_task(tmp_path, toml='version = "1.0"\n'))
    assert task.agent_timeout_s is None and task.agent_time_limit_s > 0
    assert (task.verifier_timeout_s, task.build_timeout_s) == (600, 600)
    assert task.allow_internet is True
    assert (task.cpus, task.memory_mb, task.storage_mb) == (None, None, None)
    assert task.difficulty is None and task.metadata == {}


def test_prebuilt_image_needs_no_dockerfile(tmp_path: Path) -> None:
    folder = harbor_task(tmp_path, toml='[environment]\ndocker_image = "example/prebuilt:1"\n')
    (folder / "environment" / "Dockerfile").unlink()
    task = load_task(folder)
    assert task.docker_image == "example/prebuilt:1" and task.build_context is None


@pytest.mark.parametrize(
    ("memory", "storage", "expected"),
    [('"2G"', '"10G"', (2048, 10240)), ('"512M"', '"1.5G"', (512, 1536)), ('"4Gi"', '"2048MB"', (4096, 2048))],
)
def test_legacy_size_strings(tmp_path: Path, memory: str, storage: str, expected: tuple[int, int]) -> None:
    task = load_task(harbor_task(tmp_path, toml=f"[environment]\nmemory = {memory}\nstorage = {storage}\n"))
    assert (task.memory_mb, task.storage_mb) == expected


def test_memory_mb_wins_over_legacy_string(tmp_path: Path) -> None:
    task = load_task(harbor_task(tmp_path, toml='[environment]\nmemory_mb = 1024\nmemory = "2G"\n'))
    assert task.memory_mb == 1024


def test_unknown_fields_are_kept_and_named_in_a_note(tmp_path: Path) -> None:
    toml = 'schema_version = "2"\nfuture = 1\n[custom]\nx = 2\n[environment]\ngpus = 0\n[verifier]\nretries = 3\n'
    task = load_task(harbor_task(tmp_path, toml=toml))
    assert task.metadata["unknown_fields"] == {"future": 1, "custom": {"x": 2}, "verifier.retries": 3}
    assert task.notes == ("fields outside Harbor's task.toml are ignored: future, custom, verifier.retries",)


def test_tb1_fields(tmp_path: Path) -> None:
    task = load_task(tb1_task(tmp_path))
    assert (task.name, task.source_format) == ("legacy", "terminal-bench-1")
    assert task.instruction == "Create /app/done.\n"
    assert (task.agent_timeout_s, task.verifier_timeout_s) == (200, 30)
    assert task.build_context == tmp_path / "legacy"
    assert task.verifier_script == tmp_path / "legacy" / "run-tests.sh"
    assert task.solution_path == tmp_path / "legacy" / "solution.sh"
    assert dict(task.verifier_env) == {"TEST_DIR": "/tests"}
    assert (task.difficulty, task.category, task.metadata["tags"]) == ("medium", "system", ["files"])
    assert task.metadata["expert_time_estimate_min"] == 5 and "unknown_fields" not in task.metadata


def test_tb1_defaults_and_old_descriptions(tmp_path: Path) -> None:
    text = "descriptions:\n  - key: base\n    description: Old style.\n"
    task = load_task(tb1_task(tmp_path, text))
    assert task.instruction == "Old style."
    assert (task.agent_timeout_s, task.verifier_timeout_s) == (360, 60)


def test_tb1_solution_yaml_is_skipped_with_a_note(tmp_path: Path) -> None:
    folder = tb1_task(tmp_path)
    (folder / "solution.sh").unlink()
    write(folder / "solution.yaml", "- command: touch /app/done\n")
    task = load_task(folder)
    assert task.solution_path is None
    assert any("solution.yaml" in note and "not supported" in note for note in task.notes)


def broken(message_parts: list[str], error: pytest.ExceptionInfo[TaskError]) -> None:
    for part in message_parts:
        assert part in str(error.value), (part, str(error.value))


def test_missing_instruction(tmp_path: Path) -> None:
    folder = harbor_task(tmp_path)
    (folder / "instruction.md").unlink()
    with pytest.raises(TaskError) as error:
        load_task(folder)
    broken([str(folder / "instruction.md"), "missing"], error)


def test_toml_syntax_error(tmp_path: Path) -> None:
    folder = harbor_task(tmp_path, toml="[agent\ntimeout_sec = 3\n")
    with pytest.raises(TaskError) as error:
        load_task(folder)
    broken([str(folder / "task.toml"), "TOML syntax"], error)


@pytest.mark.parametrize(
    ("toml", "field"),
    [
        ("[agent]\ntimeout_sec = -5\n", "agent.timeout_sec"),
        ("[verifier]\ntimeout_sec = 0\n", "verifier.timeout_sec"),
        ('[environment]\nbuild_timeout_sec = "long"\n', "environment.build_timeout_sec"),
        ("[environment]\ncpus = -1\n", "environment.cpus"),
        ('[environment]\nmemory = "lots"\n', "environment.memory"),
        ("[environment]\nmemory = 2048\n", "environment.memory"),
        ('[environment]\nallow_internet = "no"\n', "environment.allow_internet"),
        ("[environment]\nenv = { A = [1] }\n", "environment.env.A"),
        ("agent = 3\n", "agent"),
        # numbers that load in TOML but overflow where they are used (nano-CPUs, bytes, asyncio timers)
        ("[environment]\ncpus = 1e300\n", "environment.cpus"),
        ("[agent]\ntimeout_sec = 1e308\n", "agent.timeout_sec"),
        ("[verifier]\ntimeout_sec = inf\n", "verifier.timeout_sec"),
        ("[environment]\nmemory_mb = 1e300\n", "environment.memory_mb"),
        ("[environment]\nstorage_mb = 1e300\n", "environment.storage_mb"),
        ('[environment]\nstorage = "99999999T"\n', "environment.storage"),
        ("[environment]\nmemory_mb = 4\n", "environment.memory_mb"),
    ],
)
def test_bad_field_values(tmp_path: Path, toml: str, field: str) -> None:
    folder = harbor_task(tmp_path, toml=toml)
    with pytest.raises(TaskError) as error:
        load_task(folder)
    broken([str(folder / "task.toml"), f"'{field}'"], error)


def test_missing_test_script(tmp_path: Path) -> None:
    folder = harbor_task(tmp_path)
    (folder / "tests" / "test.sh").unlink()
    with pytest.raises(TaskError) as error:
        load_task(folder)
    broken([str(folder / "tests" / "test.sh"), "missing"], error)


def test_missing_dockerfile(tmp_path: Path) -> None:
    folder = harbor_task(tmp_path)
    (folder / "environment" / "Dockerfile").unlink()
    with pytest.raises(TaskError) as error:
        load_task(folder)
    broken([str(folder / "environment" / "Dockerfile"), "docker_image"], error)


@pytest.mark.parametrize(
    ("yaml_text", "field"),
    [
        ("difficulty: easy\n", "instruction"),
        ("instruction: x\nmax_agent_timeout_sec: -1\n", "max_agent_timeout_sec"),
        ("instruction: x\nparser_name: swebench\n", "parser_name"),
        ("instruction: x\nmax_test_timeout_sec: 1.0e+308\n", "max_test_timeout_sec"),
        ("- just\n- a list\n", "table of fields"),
    ],
)
def test_broken_tb1_fields(tmp_path: Path, yaml_text: str, field: str) -> None:
    folder = tb1_task(tmp_path, yaml_text)
    with pytest.raises(TaskError) as error:
        load_task(folder)
    broken([str(folder / "task.yaml"), field], error)


def test_tb1_missing_run_tests(tmp_path: Path) -> None:
    folder = tb1_task(tmp_path)
    (folder / "run-tests.sh").unlink()
    with pytest.raises(TaskError) as error:
        load_task(folder)
    broken([str(folder / "run-tests.sh"), "missing"], error)


def test_not_a_task_folder(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="no task.toml"):
        load_task(tmp_path)


def test_load_tasks_sorted_and_skips_other_folders(tmp_path: Path) -> None:
    harbor_task(tmp_path, name="zeta")
    tb1_task(tmp_path, name="alpha")
    harbor_task(tmp_path, name="mid")
    (tmp_path / "not-a-task").mkdir()
    assert [t.name for t in load_tasks(tmp_path)] == ["alpha", "mid", "zeta"]


def test_find_task_by_name_and_path(tmp_path: Path) -> None:
    folder = harbor_task(tmp_path, name="findme")
    assert find_task("findme", search=[tmp_path]).path == folder
    assert find_task(str(folder)).name == "findme"
    with pytest.raises(TaskError, match="did you mean findme"):
        find_task("findm", search=[tmp_path])


def test_find_shipped_task_by_name() -> None:
    assert find_task("hello-world").path == shipped_tasks_dir() / "hello-world"


# --- the shipped suite's own rules ---------------------------------------------------------------

SUITE = load_tasks(shipped_tasks_dir())
REQUIRED_CATEGORIES = {
    "files and permissions", "text processing", "log analysis", "shell scripting", "git", "python debugging",
    "c and make", "sql", "json", "csv to json", "archives", "regular expressions", "services and networking",
    "processes", "interactive programs", "environment and configuration",
}  # fmt: skip


def test_suite_size_and_coverage() -> None:
    assert 20 <= len(SUITE) <= 30
    assert REQUIRED_CATEGORIES <= {t.category for t in SUITE}
    counts = {level: sum(t.difficulty == level for t in SUITE) for level in ("easy", "medium", "hard")}
    assert sum(counts.values()) == len(SUITE)
    assert all(len(SUITE) // 4 <= n <= len(SUITE) // 2 for n in counts.values()), counts


@pytest.mark.parametrize("task", SUITE, ids=lambda t: t.name)
def test_suite_task_follows_the_rules(task: Task) -> None:
    assert task.allow_internet is False
    assert (task.cpus, task.memory_mb) == (1.0, 2048)
    assert task.agent_timeout_s is not None and 120 <= task.agent_timeout_s <= 900
    assert task.verifier_timeout_s <= 120
    assert task.solution_path is not None and task.notes == ()
    assert task.build_context is not None
    dockerfile = (task.build_context / "Dockerfile").read_text()
    assert re.findall(r"(?m)^FROM\s+(\S+)", dockerfile) == ["terminus-env/base:bookworm"]
    assert len(re.findall(r"apt-get install", dockerfile)) <= 1
    assert task.instruction.strip()


def test_task_table_lists_the_suite(capsys: pytest.CaptureFixture[str]) -> None:
    from terminus_env.cli.check import print_task_table

    print_task_table(shipped_tasks_dir())
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["name", "category", "difficulty", "agent", "timeout"]
    assert len(lines) == 2 + len(SUITE)
    assert any(line.split()[0] == "hello-world" and "easy" in line for line in lines)


def test_instruction_not_utf8(tmp_path: Path) -> None:
    folder = harbor_task(tmp_path)
    (folder / "instruction.md").write_bytes(b"caf\xe9\n")
    with pytest.raises(TaskError) as error:
        load_task(folder)
    broken([str(folder / "instruction.md"), "UTF-8"], error)


def test_sandbox_spec_carries_the_environment(tmp_path: Path) -> None:
    spec = load_task(harbor_task(tmp_path)).sandbox_spec("some/image:tag")
    assert (spec.image, spec.cpus, spec.memory_mb, spec.allow_internet) == ("some/image:tag", 1.0, 2048, False)
    assert (dict(spec.env), spec.workdir, spec.user) == ({"APP_MODE": "test"}, "/app", "agent")
    assert spec.lifetime_s >= 120 + 300 + 90
