"""Honest work earns its reward in train mode: the shapes of real tasks whose correct solutions the watch zeroed.

Each plays a task the way a policy solves it, through the env in train mode (the trainer's default), and asks for
reward 1.0 with no tamper finding: a false zero teaches a policy that solving the task is worthless. The shapes come
from public Terminal-Bench and Harbor tasks: verifiers that build their test environment with uv, from a cache the
image's build filled or the agent's own `uv add` filled; a test that makes the agent's program executable and runs
it; a solution that sets the time zone, installs a namespace package (setuptools' `-nspkg.pth`), or vendors a pytest
plugin the project's tests need; and a verifier's own environment that ships a pytest plugin (anyio's).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from attack_support import PYTEST_TESTS, PYTEST_VERIFIER, cheat
from shapes_support import NSPKG_LINE, TASK_TOML, assert_earned

from terminus_env import load_task

pytestmark = pytest.mark.usefixtures("docker_required")

WHEELS = ("pytest==8.4.1", "anyio==4.9.0", "uv==0.9.5")
"""What the verifiers below install, from a folder in the image (containers do not reach PyPI)."""

UV_IMAGE = """\
FROM terminus-env/base:bookworm
COPY wheels /opt/wheels
RUN cd /tmp && python3 -c "import zipfile, glob; zipfile.ZipFile(glob.glob('/opt/wheels/uv-*')[0]).extractall('uv')" \\
    && install -m 0755 /tmp/uv/uv-*.data/scripts/uv /usr/local/bin/uv && rm -rf /tmp/uv
ENV UV_OFFLINE=1 UV_FIND_LINKS=/opt/wheels UV_PYTHON=/usr/bin/python3.11 UV_NO_PROGRESS=1
WORKDIR /app
"""
PREWARM = """\
# As many real images do, the build already ran uv once: its cache holds what the verifier will install.
RUN uv venv /opt/prewarm && uv pip install --python /opt/prewarm pytest==8.4.1 anyio==4.9.0 && rm -rf /opt/prewarm
"""
# Terminal-Bench 1's run-tests.sh, as verbatim as the offline machine allows (the uv installer's download is the
# image's uv instead).
UV_VERIFIER = """\
#!/bin/bash
mkdir -p /logs/verifier
cd /app
uv venv .tbench-testing
source .tbench-testing/bin/activate
uv pip install pytest==8.4.1 anyio==4.9.0
if uv run pytest /tests/test_outputs.py -rA; then r=1; else r=0; fi
echo $r > /logs/verifier/reward.txt
"""
SYSTEM_PYTEST_VERIFIER = PYTEST_VERIFIER  # the image's pytest, run from the task's folder
HELLO_TESTS = PYTEST_TESTS
SOLVE_HELLO = "echo hello > /app/hello.txt\n"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("wheels")
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", "3.11",
                    "-d", str(folder), *WHEELS], check=True)  # fmt: skip
    return folder


def make_task(root: Path, name: str, dockerfile: str, verifier: str, tests: str, wheels: Path | None = None):
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "task.toml").write_text(TASK_TOML)
    (task / "instruction.md").write_text("Do what the tests ask.\n")
    (task / "environment" / "Dockerfile").write_text(dockerfile)
    if wheels is not None:
        shutil.copytree(wheels, task / "environment" / "wheels")
    (task / "tests" / "test.sh").write_text(verifier)
    (task / "tests" / "test_outputs.py").write_text(tests)
    return load_task(task)


def test_a_uv_verifier_over_a_cache_the_images_build_filled(tmp_path, wheels):
    """uv links what it installs from its cache: the verifier's venv would be made of the image's cache files,
    changed by that very link (their ctime), with the agent doing nothing but solving the task."""
    task = make_task(tmp_path, "uv-prewarmed", UV_IMAGE + PREWARM, UV_VERIFIER, HELLO_TESTS, wheels)
    assert_earned(*cheat(task, SOLVE_HELLO)[1:])


def test_a_uv_verifier_after_the_agents_own_uv_add(tmp_path, wheels):
    """The agent made a project of its own with `uv add pytest`: uv's cache now holds files the agent's uv wrote,
    the very ones the verifier's `uv pip install pytest` would link."""
    task = make_task(tmp_path, "uv-agent-add", UV_IMAGE, UV_VERIFIER, HELLO_TESTS, wheels)
    keys = "mkdir -p /root/w && cd /root/w && uv init --bare -q && uv add -q pytest==8.4.1 anyio==4.9.0; cd /app\n"
    assert_earned(*cheat(task, keys, SOLVE_HELLO)[1:])


PROGRAM_TESTS = """\
import subprocess


def test_the_program_answers():
    subprocess.run(["chmod", "+x", "/app/cmd.sh"], check=True)  # as Terminal-Bench 1's jq-data-processing does
    out = subprocess.run(["/app/cmd.sh"], capture_output=True, text=True, timeout=60)
    assert out.stdout == "42\\n"
"""


def test_the_tests_make_the_agents_program_executable_and_run_it(tmp_path):
    task = make_task(tmp_path, "chmod-then-run", "FROM terminus-env/base:bookworm\nWORKDIR /app\n",
                     SYSTEM_PYTEST_VERIFIER, PROGRAM_TESTS)  # fmt: skip
    assert_earned(*cheat(task, "printf '#!/bin/bash\\necho 42\\n' > /app/cmd.sh\n")[1:])


TIMEZONE_TESTS = """\
import time


def test_the_clock_is_new_yorks():
    assert time.tzname[0] == "EST"
"""


def test_a_solution_that_sets_the_time_zone(tmp_path):
    """`/etc/localtime` is a link in /etc, changed, whose target every Python reads at start: a time zone, not code."""
    task = make_task(tmp_path, "timezone", "FROM terminus-env/base:bookworm\nWORKDIR /app\n", SYSTEM_PYTEST_VERIFIER,
                     TIMEZONE_TESTS)  # fmt: skip
    assert_earned(*cheat(task, "ln -sf /usr/share/zoneinfo/America/New_York /etc/localtime\n")[1:])


NSPKG_TESTS = """\
def test_the_namespace_package_imports():
    from acme.tools import answer

    assert answer() == 42
"""


def test_a_solution_that_installs_a_namespace_package(tmp_path):
    """A wheel built the old setuptools way ships `*-nspkg.pth`, whose one line starts with `import`: setuptools'
    own line, which runs at every Python start and only makes the namespace's module."""
    site = "/usr/local/lib/python3.11/dist-packages"
    keys = (
        f"mkdir -p {site}/acme/tools && printf 'def answer():\\n    return 42\\n' > {site}/acme/tools/__init__.py && "
        f"printf '%s\\n' {_quoted(NSPKG_LINE)} > {site}/acme.tools-1.0-py3.11-nspkg.pth\n"
    )
    task = make_task(tmp_path, "nspkg", "FROM terminus-env/base:bookworm\nWORKDIR /app\n", SYSTEM_PYTEST_VERIFIER,
                     NSPKG_TESTS)  # fmt: skip
    assert_earned(*cheat(task, keys)[1:])


PROJECT_TESTS = """\
import subprocess


def test_the_projects_own_tests_pass():
    out = subprocess.run(["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd="/app",
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout
"""
VENDORED_PLUGIN = textwrap.dedent("""\
    mkdir -p /app/tests /app/vendor
    printf 'import pytest\\n@pytest.fixture\\ndef answer():\\n    return 42\\n' > /app/vendor/answer_plugin.py
    printf 'import sys\\nsys.path.insert(0, "/app/vendor")\\npytest_plugins = ["answer_plugin"]\\n' > /app/conftest.py
    printf 'def test_answer(answer):\\n    assert answer == 42\\n' > /app/tests/test_answer.py
""")


def test_a_vendored_pytest_plugin_the_projects_tests_need(tmp_path):
    task = make_task(tmp_path, "vendored-plugin", "FROM terminus-env/base:bookworm\nWORKDIR /app\n",
                     SYSTEM_PYTEST_VERIFIER, PROJECT_TESTS)  # fmt: skip
    assert_earned(*cheat(task, VENDORED_PLUGIN)[1:])


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


PYTHON_WRITES_THE_REWARD = """\
#!/bin/bash
mkdir -p /logs/verifier
python3 - <<'EOF'
import json, pathlib, sys
helper = pathlib.Path("/tmp/grading/checks.py")  # a module of the verifier's own, written and imported here
helper.parent.mkdir(exist_ok=True)
helper.write_text("def passed():\\n    return open('/app/hello.txt').read() == 'hello\\\\n'\\n")
sys.path.insert(0, str(helper.parent))
import checks
json.dump({"reward": 1.0 if checks.passed() else 0.0}, open("/logs/verifier/reward.json", "w"))
EOF
"""


def test_a_reward_written_by_the_verifiers_own_python(tmp_path):
    """The verifier's Python writes a module of its own (and its bytecode), imports it, then writes the reward: files
    it wrote itself are its own, so nothing it ran was the agent's."""
    task = make_task(tmp_path, "python-reward", "FROM terminus-env/base:bookworm\nWORKDIR /app\n",
                     PYTHON_WRITES_THE_REWARD, HELLO_TESTS)  # fmt: skip
    assert_earned(*cheat(task, SOLVE_HELLO)[1:])


NO_BYTECODE_IMAGE = """\
FROM terminus-env/base:bookworm
# As official python images: no bytecode cache beside the image's modules, so the first Python to run writes it.
RUN find /usr/lib/python3.11 /usr/lib/python3/dist-packages -name '*.pyc' -delete
WORKDIR /app
"""


def test_the_bytecode_cache_the_agents_own_python_wrote(tmp_path):
    """Any Python the agent runs writes the bytecode of the modules it imports beside them; the verifier's Python
    then loads those files, before its tests begin. Each is exactly the compilation of the unchanged source beside
    it, so it is no code of the agent's."""
    task = make_task(tmp_path, "agents-bytecode", NO_BYTECODE_IMAGE, SYSTEM_PYTEST_VERIFIER, HELLO_TESTS)
    keys = "python3 -c 'import argparse, ast, enum, typing' && ls /usr/lib/python3.11/__pycache__ | grep -c argparse\n"
    seen, reward, info = cheat(task, keys, SOLVE_HELLO)
    assert "\n1\n" in seen  # the agent's Python wrote argparse's bytecode, which pytest imports at start
    assert_earned(reward, info)


WHEELS_IMAGE = """\
FROM terminus-env/base:bookworm
COPY wheels /opt/wheels
WORKDIR /app
"""
# What `pip install httpx` leaves: anyio and its dependencies, each with the installer's RECORD (pip is not in the
# base image; a wheel unpacked into the site folder is what pip writes, less its INSTALLER file).
INSTALL_ANYIO = (
    "for w in /opt/wheels/anyio-* /opt/wheels/sniffio-* /opt/wheels/idna-* /opt/wheels/typing_extensions-*; do "
    "python3 -m zipfile -e $w /usr/local/lib/python3.11/dist-packages/; done\n"
)


def test_a_pytest_plugin_an_installed_package_registers_is_not_the_verifiers(tmp_path, wheels):
    """The image's pytest verifies, and the solution installed anyio system-wide (as `pip install httpx` does), which
    registers a pytest plugin. The verifier's pytest does not see registrations the agent made (the agent may not
    choose the runner's plugins), so it runs the tests without it, and the honest solution earns its reward."""
    task = make_task(tmp_path, "anyio-system", WHEELS_IMAGE, SYSTEM_PYTEST_VERIFIER, HELLO_TESTS, wheels)
    _, reward, info = cheat(task, INSTALL_ANYIO, SOLVE_HELLO)
    episode = info["episode"]
    assert (reward, info["end_reason"], episode["tampering"]) == (1.0, "task_complete", ()), episode["error"]


MANY_OUTPUTS_TESTS = """\
import os
import subprocess


def test_every_output_file_holds_its_number():
    subprocess.run(["python3", "/app/more.py"], check=True, timeout=600)  # the agent's program writes the rest
    names = os.listdir("/app/out")
    assert len(names) == 205000
    for name in names:
        with open(os.path.join("/app/out", name)) as handle:
            assert handle.read() == name
"""
MANY_OUTPUTS = (
    "mkdir -p /app/out && python3 -c \"[open(f'/app/out/{i}', 'w').write(str(i)) for i in range(105000)]\" && "
    "printf \"[open(f'/app/out/{i}', 'w').write(str(i)) for i in range(105000, 205000)]\\n\" > /app/more.py; "
    "echo made=$?\n"
)


def test_a_verifier_that_reads_more_files_than_the_watch_records(tmp_path):
    """205,000 output files, more than the watch records (MAX_WATCHED_FILES): 105,000 the agent made before the
    run, 100,000 its program writes while the tests run. Data decides nothing and is counted, not recorded."""
    task = make_task(tmp_path, "many-outputs", "FROM terminus-env/base:bookworm\nWORKDIR /app\n",
                     SYSTEM_PYTEST_VERIFIER, MANY_OUTPUTS_TESTS)  # fmt: skip
    observed, reward, info = cheat(task, MANY_OUTPUTS, wait=300)
    assert "made=0" in observed
    assert_earned(reward, info)


GO_IMAGE = """\
FROM terminus-env/base:bookworm
WORKDIR /app
RUN mkdir -p /app/cmd/server /app/cmd/client && printf 'package main\\n' > /app/cmd/server/main.go \\
    && printf 'package main\\n' > /app/cmd/client/main.go && printf 'module example.com/app\\n' > /app/go.mod
"""
# As a public Go task's test.sh does before its checks: the image's own files in /app change owner and mode.
OWNING_VERIFIER = PYTEST_VERIFIER.replace("cd /app\n", "cd /app\nchown -R 0:0 /app\nchmod -R go-w /app\n")
GO_TESTS = """\
import glob


def test_the_commands_and_the_answer():
    assert sorted(glob.glob("/app/cmd/*/main.go")) == ["/app/cmd/client/main.go", "/app/cmd/server/main.go"]
    for path in glob.glob("/app/cmd/*/main.go") + ["/app/go.mod"]:
        assert open(path).read()
    assert open("/app/hello.txt").read() == "hello\\n"
"""


def test_a_verifier_that_takes_ownership_of_the_working_folder(tmp_path):
    """The verifier's own chown and chmod of the image's files are not the agent's changes."""
    task = make_task(tmp_path, "owning-verifier", GO_IMAGE, OWNING_VERIFIER, GO_TESTS)
    assert_earned(*cheat(task, SOLVE_HELLO)[1:])


# A held-out public task's shape: after the agent's code has run (here a first pytest run, whose test imports the
# agent's module), its test script installs a package into /usr/local, then runs pytest again on that package.
# Here the installer is one `cp` per module, 3,000 of them: each exits right after its write, before the watch reads
# the event. The installer's writes are the verifier's own, however late the watch reads them.
UNPACKING_IMAGE = """\
FROM terminus-env/base:bookworm
RUN mkdir -p /tmp/p/pytest_zz && cd /tmp/p && python3 -c "import pathlib; [pathlib.Path(f'pytest_zz/m{i}.py') \\
    .write_text(f'N = {i}\\\\n') for i in range(3000)]; pathlib.Path('pytest_zz/__init__.py').write_text('')" \\
    && tar -cf /opt/pytest_zz.tar pytest_zz && rm -rf /tmp/p
WORKDIR /app
"""
UNPACKING_VERIFIER = """\
#!/bin/bash
mkdir -p /logs/verifier /usr/local/lib/python3.11/dist-packages/pytest_zz
cd /app
python3 -m pytest -p no:cacheprovider -q /tests/test_outputs.py -k answered
tar -C /tmp -xf /opt/pytest_zz.tar
for module in /tmp/pytest_zz/*.py; do cp "$module" /usr/local/lib/python3.11/dist-packages/pytest_zz/; done
if python3 -m pytest -p no:cacheprovider -rA /tests/test_outputs.py -k package; then r=1; else r=0; fi
echo $r > /logs/verifier/reward.txt
"""
ANSWER_TESTS = """\
import importlib
import sys


def test_the_program_answered():
    sys.path.insert(0, "/app")
    import answer

    assert answer.ANSWER == 42


def test_the_verifiers_package_imports():
    assert [importlib.import_module(f"pytest_zz.m{i}").N for i in range(3000)] == list(range(3000))
"""


@contextlib.contextmanager
def cpu_bound(count: int):
    """``count`` CPU-bound processes on this host while the block runs: the watch reads its events late."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


@pytest.mark.parametrize("busy", [0, 2], ids=["quiet", "two-cpu-bound-beside"])
def test_the_verifiers_own_unpacking_after_the_agents_code_ran(tmp_path, busy):
    task = make_task(tmp_path, "unpack-after-program", UNPACKING_IMAGE, UNPACKING_VERIFIER, ANSWER_TESTS)
    with cpu_bound(busy):
        assert_earned(*cheat(task, "echo 'ANSWER = 42' > /app/answer.py\n")[1:])
