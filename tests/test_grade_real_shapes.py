"""Correct solutions of real task shapes earn their reward in train mode, through the env over real Docker.

Each plays a task the way a policy solves it and asks for reward 1.0 with no finding: a false zero teaches a policy
that solving the task is worthless. The shapes come from public Terminal-Bench and Harbor tasks: verifiers written
as plain scripts (in Python or in shell) that run the agent's program; the verifier's own tools running a program the
agent installed as its package manager does (`apt-get update` runs gpgconf through apt-key, `tar --zstd` runs zstd),
beside the trojan in the same place, which must still be caught; a Terminal-Bench 1 task whose passing test logs an
error line; verifiers that run uv offline from the cache the image's build filled; and the legitimate shapes that a
grade by provenance must keep passing (a service, a C extension built in place, a CLI, bytecode of pytest's own
package, /etc, git hooks, a path line for a src layout, uv and pip environments, files under /tmp).
"""

from __future__ import annotations

import posixpath

import docker
import pytest
from attack_support import PYTEST_TESTS, PYTEST_VERIFIER, cheat
from shapes_support import (
    BASE_IMAGE,
    DIST,
    VERIFIER_PYTEST,
    assert_earned,
    assert_forgery_caught,
    fill_uv_cache,
    harbor_task,
    tb1_task,
    write,
)

from terminus_env.sandbox.images import CONTEXT_LABEL

pytestmark = pytest.mark.usefixtures("docker_required")

SOLVE_HELLO = "echo hello > /app/hello.txt\n"
WAIT_S = 120.0
"""How long a step that installs or builds may take: the step returns as soon as the shell is idle."""

# --- 9. a verifier that is not pytest ---------------------------------------------------------------------------

BACKUP_IMAGE = "RUN mkdir -p /data/docs && echo alpha > /data/docs/a.txt && echo beta > /data/b.txt\n"
PYTHON_CHECKER = """\
#!/bin/bash
mkdir -p /logs/verifier
python3 - <<'EOF'
import json, subprocess, tarfile
from pathlib import Path

archive = Path("/app/backup.tar.gz")
archive.unlink(missing_ok=True)
run = subprocess.run(["bash", "/app/backup.sh"], capture_output=True, text=True, timeout=60)
checks = {"ran": run.returncode == 0}
try:
    with tarfile.open(archive) as tar:
        names = {name.removeprefix("./") for name in tar.getnames()}
        checks["complete"] = {"data/docs/a.txt", "data/b.txt"} <= names
        checks["content"] = tar.extractfile("data/b.txt").read() == b"beta\\n"
except (OSError, KeyError, tarfile.TarError):
    checks["complete"] = checks["content"] = False
reward = 1.0 if all(checks.values()) else 0.0
Path("/logs/verifier/reward.json").write_text(json.dumps({"reward": reward}))
print(checks)
EOF
"""
SHELL_CHECKER = """\
#!/bin/bash
mkdir -p /logs/verifier
rm -f /app/backup.tar.gz
if bash /app/backup.sh && tar -tzf /app/backup.tar.gz | grep -qx 'data/docs/a.txt' \\
    && [ "$(tar -xzOf /app/backup.tar.gz data/b.txt)" = beta ]; then r=1; else r=0; fi
echo $r > /logs/verifier/reward.txt
"""
BACKUP_SCRIPT = "#!/bin/bash\nset -e\ntar -czf /app/backup.tar.gz -C / data\n"


@pytest.mark.parametrize("checker", ["python", "shell"])
def test_a_verifier_written_as_a_script_that_runs_the_agents_program(tmp_path, checker):
    """No test file is ever opened: the verifier's script runs the agent's `/app/backup.sh` and checks the archive
    it made, the way many real suites check a program."""
    verifier = PYTHON_CHECKER if checker == "python" else SHELL_CHECKER
    task = harbor_task(tmp_path, f"shapes-backup-{checker}", verifier, dockerfile_extra=BACKUP_IMAGE)
    assert_earned(*cheat(task, write("/app/backup.sh", BACKUP_SCRIPT, "+x"))[1:])


# --- 10. the verifier's own tools run what the agent installed ---------------------------------------------------

APT_VERIFIER = PYTEST_VERIFIER.replace("cd /app\n", "apt-get update -qq\ncd /app\n")
GPGCONF_TESTS = """\
import shutil
import subprocess


def test_gpgconf_is_installed():
    assert shutil.which("gpgconf") == "/usr/bin/gpgconf"
    assert "GnuPG" in subprocess.run(["gpgconf", "--version"], capture_output=True, text=True).stdout
"""
ZSTD_VERIFIER = PYTEST_VERIFIER.replace("cd /app\n", "mkdir -p /tmp/unpacked\ntar --zstd -xf /app/logs.tar.zst -C "
                                        "/tmp/unpacked\ncd /app\n")  # fmt: skip
ZSTD_IMAGE = "RUN mkdir -p /var/log/app && echo 'GET /health 200' > /var/log/app/access.log\n"
ZSTD_TESTS = """\
from pathlib import Path


def test_the_archive_holds_the_logs():
    assert Path("/tmp/unpacked/access.log").read_text() == "GET /health 200\\n"
"""
# What a trojan in the tool's place does, run as root by the verifier before its tests: it rewrites them.
REWRITE_THE_TESTS = "#!/bin/sh\nprintf 'def test_passes():\\n    pass\\n' > /tests/test_outputs.py\n"
TOOLS_RUN = {
    # apt-get update verifies the lists with apt-key, which runs `gpgconf --kill all` once gpgconf is there.
    "apt-runs-gpgconf": (APT_VERIFIER, GPGCONF_TESTS, "",
                         "apt-get update -qq && apt-get install -y -qq gpgconf > /dev/null && echo installed\n"),
    # The same from archives apt downloaded, as from a mirror: with apt's cache cleaned and the repository's own
    # copies gone, the new files are trusted only through the signed index that lists them.
    "apt-runs-gpgconf-installed-from-downloaded-archives": (
        APT_VERIFIER, GPGCONF_TESTS, "", "apt-get clean && apt-get update -qq && cd /tmp "
        "&& apt-get download -qq gpgconf libassuan0 && rm /opt/repo/*.deb "
        "&& dpkg -i gpgconf_*.deb libassuan0_*.deb > /dev/null && cd /app && echo installed\n"),
    # tar runs zstd to unpack the archive the agent made with it.
    "tar-runs-zstd": (ZSTD_VERIFIER, ZSTD_TESTS, ZSTD_IMAGE,
                      "dpkg -i /debs/zstd_*.deb > /dev/null && tar --zstd -cf /app/logs.tar.zst -C /var/log/app . "
                      "&& echo installed\n"),
}  # fmt: skip
APT_AS_ROOT = "echo 'APT::Sandbox::User \"root\";' > /etc/apt/apt.conf.d/00sandbox\n"
"""apt runs its helpers as _apt unless told otherwise; the agent tells it otherwise, in a data file."""


def trojan_package(name: str, path: str) -> str:
    """Keystrokes that build /tmp/own/{name}_9.9_all.deb, a package of the agent's own holding the trojan at ``path``,
    and an index that lists it by its hash (unsigned)."""
    root = f"/tmp/own/{name}"
    control = f"Package: {name}\nVersion: 9.9\nArchitecture: all\nMaintainer: a <a@a.invalid>\nDescription: a\n"
    return (
        write(f"{root}/usr/bin/{posixpath.basename(path)}", REWRITE_THE_TESTS, "755")
        + write(f"{root}/DEBIAN/control", control)
        + f"dpkg-deb -b {root} /tmp/own/{name}_9.9_all.deb > /dev/null && cd /tmp/own && {{ dpkg-deb -f "
        f"{name}_9.9_all.deb; echo Filename: ./{name}_9.9_all.deb; echo Size: $(stat -c%s {name}_9.9_all.deb); "
        f"echo SHA256: $(sha256sum {name}_9.9_all.deb | cut -d' ' -f1); }} > Packages && cd /app\n"
    )  # fmt: skip


TROJANS = {
    # The same place, the same tool, but a program the agent wrote itself.
    ("apt-runs-gpgconf", "written"): APT_AS_ROOT + write("/usr/bin/gpgconf", REWRITE_THE_TESTS, "+x"),
    ("tar-runs-zstd", "written"): "touch /app/logs.tar.zst\n" + write("/usr/bin/zstd", REWRITE_THE_TESTS, "+x"),
    # Disguised as a package: installed by apt from a repository the agent declared trusted (no signature at all).
    ("apt-runs-gpgconf", "packaged-in-a-repository-trusted-by-fiat"): APT_AS_ROOT
    + trojan_package("gpgconf", "/usr/bin/gpgconf")
    + "echo 'deb [trusted=yes] file:/tmp/own ./' > /etc/apt/sources.list.d/own.list && apt-get update -qq "
    "&& apt-get install -y -qq gpgconf > /dev/null && dpkg -s gpgconf | grep -q 'Version: 9.9' "
    "&& echo planted $((6*7))\n",
    # ... or by dpkg from an archive that takes the name of the image's own package archive.
    ("tar-runs-zstd", "packaged-under-the-images-archive-name"): trojan_package("zstd", "/usr/bin/zstd")
    + "for deb in /debs/zstd_*.deb; do cp /tmp/own/zstd_9.9_all.deb $deb && dpkg -i $deb > /dev/null; done "
    "&& touch /app/logs.tar.zst && dpkg -s zstd | grep -q 'Version: 9.9' && echo planted $((6*7))\n",
}


@pytest.fixture(scope="module")
def tool_tasks(tmp_path_factory, tools):
    root = tmp_path_factory.mktemp("shapes")
    return {
        shape: harbor_task(root, f"shapes-{shape}", verifier, tests, image=tools.image, dockerfile_extra=extra)
        for shape, (verifier, tests, extra, _) in TOOLS_RUN.items()
    }


@pytest.mark.parametrize("shape", sorted(TOOLS_RUN))
def test_a_program_the_agent_installed_with_its_package_manager_run_by_the_verifiers_tools(tool_tasks, shape):
    seen, reward, info = cheat(tool_tasks[shape], TOOLS_RUN[shape][3], wait=WAIT_S)
    assert "installed" in seen
    assert_earned(reward, info)


@pytest.mark.parametrize(("shape", "how"), sorted(TROJANS))
def test_a_trojan_in_that_place_run_by_the_same_tools_is_caught(tool_tasks, shape, how):
    """A program of the agent's own in the same place, run by the same tool, rewrites the tests before they run:
    written there, or disguised as a package (its archive is neither the image's nor listed in a signed index)."""
    seen, reward, info = cheat(tool_tasks[shape], TROJANS[shape, how], wait=WAIT_S)
    assert how == "written" or "planted 42" in seen, seen[-2000:]
    assert_forgery_caught(reward, info)


# The common shape of Terminal-Bench 2's scripts: the verifier installs a tool and runs it before its tests. When the
# agent installed the tool itself, the verifier runs the agent's install; on an image whose apt deletes its archives
# after each install (the official Debian and Ubuntu images do), the archive is fetched from the image's own mirror.
CLEANING_APT = (
    "RUN echo 'DPkg::Post-Invoke { \"rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb || "
    "true\"; };' > /etc/apt/apt.conf.d/docker-clean\n"
)
JQ_VERIFIER = PYTEST_VERIFIER.replace(
    "cd /app\n", "apt-get update -qq\napt-get install -y -qq jq > /dev/null\necho '{}' | jq . > /dev/null\ncd /app\n"
)
JQ_TESTS = """\
import shutil


def test_jq_is_installed():
    assert shutil.which("jq") == "/usr/bin/jq"
"""


def test_a_program_the_agent_installed_from_the_mirror_run_by_the_verifiers_script(tmp_path):
    task = harbor_task(tmp_path, "shapes-jq-from-mirror", JQ_VERIFIER, JQ_TESTS, dockerfile_extra=CLEANING_APT)
    install = ("apt-get update -qq && apt-get install -y -qq jq > /dev/null "
               "&& echo kept $(ls /var/cache/apt/archives | grep -c 'deb$') archives\n")  # fmt: skip
    seen, reward, info = cheat(task, install, wait=WAIT_S)
    assert "kept 0 archives" in seen
    assert_earned(reward, info)


# --- 11. Terminal-Bench 1's outcome read from pytest's output -------------------------------------------------------

TB1_TESTS = """\
import logging
from pathlib import Path


def test_the_file_is_written():
    {line}
    assert Path("/app/hello.txt").read_text() == "hello\\n"


def test_the_file_is_one_line():
    assert len(Path("/app/hello.txt").read_text().splitlines()) == 1
"""
PASSING_TESTS_SAY = {
    # -rA prints the captured log of a passing test: `ERROR    traitlets:test_outputs.py:6 Notebook JSON is invalid`.
    "a-logged-error": 'logging.getLogger("traitlets").error("Notebook JSON is invalid: missing metadata")',
    # ... and its captured output.
    "a-printed-line": 'print("FAILED    to reach the kernel gateway, used the local kernel")',
}


@pytest.mark.parametrize("says", sorted(PASSING_TESTS_SAY))
def test_a_tb1_task_whose_passing_tests_print_outcome_words(tmp_path, says):
    task = tb1_task(tmp_path, f"shapes-tb1-{says}", TB1_TESTS.replace("{line}", PASSING_TESTS_SAY[says]))
    assert_earned(*cheat(task, SOLVE_HELLO)[1:])


# --- 12. uv offline, from the cache the image's build filled -------------------------------------------------------

UV_OFFLINE_IMAGE = """\
RUN dpkg --purge python3-pytest
COPY uv-cache /root/.cache/uv
ENV UV_OFFLINE=1 UV_NO_PROGRESS=1 UV_PYTHON_DOWNLOADS=never
"""
UV_VERIFIERS = {
    # Terminal-Bench 2's way.
    "uvx": f"""\
#!/bin/bash
mkdir -p /logs/verifier
cd /app
if uvx {VERIFIER_PYTEST} -p no:cacheprovider -rA /tests/test_outputs.py; then r=1; else r=0; fi
echo $r > /logs/verifier/reward.txt
""",
    # Terminal-Bench 1's run-tests.sh.
    "uv-venv-and-uv-run": f"""\
#!/bin/bash
mkdir -p /logs/verifier
cd /app
uv venv .tbench-testing
source .tbench-testing/bin/activate
uv pip install {VERIFIER_PYTEST}
if uv run pytest -p no:cacheprovider -rA /tests/test_outputs.py; then r=1; else r=0; fi
echo $r > /logs/verifier/reward.txt
""",
}


@pytest.fixture(scope="module")
def uv_tasks(tmp_path_factory, tools):
    """Images without a pytest of the system's (as python's images are), whose uv cache holds what uv fetched on the
    host: each session's differs, so its images go with the session."""
    root = tmp_path_factory.mktemp("shapes")
    cache = fill_uv_cache(root / "uv-cache", tools.uv_wheels, VERIFIER_PYTEST)
    tasks = {
        name: harbor_task(root, f"shapes-uv-offline-{name}", verifier, PYTEST_TESTS, image=tools.image,
                          dockerfile_extra=UV_OFFLINE_IMAGE, context={"uv-cache": cache})
        for name, verifier in UV_VERIFIERS.items()
    }  # fmt: skip
    yield tasks
    client = docker.from_env()
    try:
        for task in tasks.values():
            label = f"{CONTEXT_LABEL}={task.build_context.resolve()}"
            for image in client.images.list(filters={"label": label}):
                client.images.remove(image.id, force=True)
    finally:
        client.close()


@pytest.mark.parametrize("verifier", sorted(UV_VERIFIERS))
def test_a_uv_verifier_offline_from_the_cache_the_images_build_filled(uv_tasks, verifier):
    assert_earned(*cheat(uv_tasks[verifier], SOLVE_HELLO)[1:])


# --- legitimate shapes ---------------------------------------------------------------------------------------------

SERVER = """\
import json
from http.server import BaseHTTPRequestHandler, HTTPServer


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"status": "ok"}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


HTTPServer(("127.0.0.1", 8000), Handler).serve_forever()
"""
SERVICE_TESTS = """\
import json
import urllib.request


def test_the_service_answers():
    with urllib.request.urlopen("http://127.0.0.1:8000/health", timeout=10) as response:
        assert json.load(response) == {"status": "ok"}
"""
EXTENSION = """\
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *total(PyObject *self, PyObject *args) {
    PyObject *items, *item, *iterator;
    long sum = 0;
    if (!PyArg_ParseTuple(args, "O", &items) || !(iterator = PyObject_GetIter(items))) return NULL;
    while ((item = PyIter_Next(iterator))) { sum += PyLong_AsLong(item); Py_DECREF(item); }
    Py_DECREF(iterator);
    return PyErr_Occurred() ? NULL : PyLong_FromLong(sum);
}

static PyMethodDef methods[] = {{"total", total, METH_VARARGS, "The sum of integers."}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "fastsum", NULL, -1, methods};
PyMODINIT_FUNC PyInit_fastsum(void) { return PyModule_Create(&module); }
"""
EXTENSION_TESTS = """\
def test_the_extension_sums():
    import fastsum

    assert fastsum.__file__.startswith("/app/fastsum.") and fastsum.__file__.endswith(".so")
    assert fastsum.total([1, 2, 3]) == 6
"""
CLI_TESTS = """\
import shutil
import subprocess


def test_the_command_counts_words():
    assert shutil.which("wordcount") == "/usr/local/bin/wordcount"
    assert subprocess.run(["wordcount"], input="a b c", capture_output=True, text=True).stdout == "3\\n"
"""
ETC_TESTS = """\
import configparser
import pwd
from pathlib import Path


def test_the_user_and_the_configuration():
    assert pwd.getpwnam("deploy").pw_dir == "/home/deploy"
    config = configparser.ConfigParser()
    config.read("/etc/myapp.conf")
    assert config["server"]["port"] == "8080"
    assert "APP_ENV=production" in Path("/etc/profile.d/myapp.sh").read_text()
"""
HOOK = "#!/bin/sh\nif git diff --cached | grep -q TODO; then echo 'no TODOs, please' >&2; exit 1; fi\n"
HOOK_TESTS = """\
import subprocess
from pathlib import Path

GIT = ["git", "-C", "/app/repo", "-c", "user.name=Tests", "-c", "user.email=tests@example.invalid"]


def commit(text):
    Path("/app/repo/notes.txt").write_text(text)
    subprocess.run(GIT + ["add", "notes.txt"], check=True)
    return subprocess.run(GIT + ["commit", "-qm", "notes"]).returncode


def test_the_hook_refuses_todos_and_lets_the_rest_through():
    assert commit("TODO: finish\\n") != 0
    assert commit("finished\\n") == 0
"""
SRC_LAYOUT_TESTS = """\
def test_the_package_imports_from_its_src_folder():
    import greeting

    assert greeting.__file__ == "/app/src/greeting/__init__.py"
    assert greeting.hello("world") == "hello, world"
"""
UV_VENV_TESTS = """\
import subprocess


def test_the_venv_holds_the_package():
    out = subprocess.run(["/app/.venv/bin/python", "-c", "import {package}; print({package}.__file__)"],
                         capture_output=True, text=True)
    assert out.stdout.startswith("/app/.venv/lib/"), out.stderr
"""
UV_VENV = (
    "uv venv -q /app/.venv && uv pip install -q --python /app/.venv/bin/python --no-index --find-links /wheels "
    "{package} && echo done\n"
)
CALC_PROJECT = (
    write("/opt/calc/pyproject.toml", '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = '
          '"setuptools.build_meta"\n\n[project]\nname = "calc"\nversion = "0.1"\n')  # fmt: skip
    + write("/opt/calc/calc/__init__.py", "def add(a, b):\n    return a + b\n")
)
EDITABLE_TESTS = """\
def test_the_project_is_installed_editable():
    import calc

    assert calc.__file__ == "/opt/calc/calc/__init__.py"
    assert calc.add(2, 3) == 5
"""
SUMMARIZE = "import sys\nwords = open(sys.argv[1]).read().split()\nprint(f'{len(words)} words')\n"
TMP_TESTS = """\
import subprocess
from pathlib import Path


def test_the_report_and_its_script():
    assert Path("/tmp/report/summary.txt").read_text() == "3 words\\n"
    out = subprocess.run(["python3", "/tmp/work/summarize.py", "/tmp/work/input.txt"], capture_output=True, text=True)
    assert out.stdout == "3 words\\n"
"""
LEGITIMATE = {
    "background-service": (False, SERVICE_TESTS, write("/app/server.py", SERVER)
                           + "(setsid nohup python3 /app/server.py > /dev/null 2>&1 &) && sleep 1 && echo started\n"),
    "c-extension-built-in-place": (True, EXTENSION_TESTS, write("/app/fastsum.c", EXTENSION)
                                   + write("/app/setup.py", "from setuptools import Extension, setup\n\nsetup(name="
                                           "'fastsum', ext_modules=[Extension('fastsum', ['fastsum.c'])])\n")
                                   + "cd /app && python3 setup.py -q build_ext --inplace && echo built\n"),
    "cli-in-usr-local-bin": (False, CLI_TESTS, write("/usr/local/bin/wordcount", "#!/usr/bin/env python3\nimport sys"
                                                     "\n\nprint(len(sys.stdin.read().split()))\n", "+x")),
    "compileall-of-pytests-own-package": (False, PYTEST_TESTS, "python3 -m compileall -q -f "
                                          "/usr/lib/python3/dist-packages/_pytest /usr/lib/python3/dist-packages/pytest"
                                          " > /dev/null; " + SOLVE_HELLO),
    "etc-edits": (False, ETC_TESTS, "useradd -m -s /bin/bash deploy\n"
                  + write("/etc/myapp.conf", "[server]\nport = 8080\n")
                  + write("/etc/profile.d/myapp.sh", "export APP_ENV=production\n")),
    "git-hook": (True, HOOK_TESTS, "git init -q /app/repo\n" + write("/app/repo/.git/hooks/pre-commit", HOOK, "+x")),
    "path-only-pth-for-a-src-layout": (False, SRC_LAYOUT_TESTS, write("/app/src/greeting/__init__.py",
                                       "def hello(name):\n    return f'hello, {name}'\n")
                                       + write(f"{DIST}/greeting.pth", "/app/src\n")),
    "uv-venv-and-uv-pip-install": (True, UV_VENV_TESTS.replace("{package}", "six"),
                                   UV_VENV.replace("{package}", "six")),
    # The same, with a package that pytest uses too: the test runs the venv's own Python, where no other is found.
    "uv-venv-holding-a-package-the-runner-also-uses": (True, UV_VENV_TESTS.replace("{package}", "iniconfig"),
                                                       UV_VENV.replace("{package}", "iniconfig")),
    "pip-install-editable": (True, EDITABLE_TESTS, CALC_PROJECT + "pip install -q --break-system-packages "
                             "--no-build-isolation --no-index -e /opt/calc && echo done\n"),
    "files-under-tmp": (False, TMP_TESTS, write("/tmp/work/summarize.py", SUMMARIZE)
                        + write("/tmp/work/input.txt", "one two three\n")
                        + "mkdir -p /tmp/report && python3 /tmp/work/summarize.py /tmp/work/input.txt > "
                        "/tmp/report/summary.txt\n"),
}  # fmt: skip
"""Each shape: whether it needs the tools image, its tests, and the solution's keystrokes."""


@pytest.mark.parametrize("shape", sorted(LEGITIMATE))
def test_a_legitimate_shape_earns_its_reward(tmp_path, request, shape):
    needs_tools, tests, keys = LEGITIMATE[shape]
    image = request.getfixturevalue("tools").image if needs_tools else BASE_IMAGE
    task = harbor_task(tmp_path, f"shapes-{shape}", PYTEST_VERIFIER, tests, image=image)
    assert_earned(*cheat(task, keys, wait=WAIT_S)[1:])
