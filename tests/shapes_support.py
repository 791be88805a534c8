"""What the tests of the grade's rules and of real task shapes share: a task written in a few lines, the image of the
tools real tasks use, keystrokes that write a file, zips and wheels made on the host, and the verdicts asked for.

The tools image is built once a session, FROM the base image: pip and venv, setuptools, a compiler and Python's
headers, git, uv, a wheelhouse in ``/wheels`` (pytest and what it needs, and six, downloaded on the host: containers do
not reach PyPI), zstd's package in ``/debs`` for the agent to install, and a signed local apt repository (the image's
only source) that holds gpgconf, which `apt-get update` runs through apt-key once it is installed.
"""

from __future__ import annotations

import base64
import io
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from terminus_env import load_task
from terminus_env.rules import EndReason, Fault
from terminus_env.sandbox import ensure_image
from terminus_env.tasks import Task

BASE_IMAGE = "terminus-env/base:bookworm"
DIST = "/usr/local/lib/python3.11/dist-packages"
"""The first site folder of Debian's Python: a module here is found before the distribution's own."""
VERIFIER_PYTEST = "pytest==8.4.1"
AGENTS_PACKAGE = "six==1.17.0"
"""A small package of no runner's, in the wheelhouse for the agent's own environments."""
UV_WHEEL = "uv==0.9.5"
TASK_TOML = """\
version = "1.0"
[metadata]
difficulty = "easy"
[verifier]
timeout_sec = 300.0
[agent]
timeout_sec = 300.0
[environment]
build_timeout_sec = 600.0
cpus = 1
memory_mb = 2048
storage_mb = 4096
"""
NSPKG_LINE = (
    "import sys, types, os;has_mfs = sys.version_info > (3, 5);p = os.path.join(sys._getframe(1).f_locals['sitedir'], "
    "*('acme',));importlib = has_mfs and __import__('importlib.util');has_mfs and __import__('importlib.machinery');"
    "m = has_mfs and sys.modules.setdefault('acme', importlib.util.module_from_spec(importlib.machinery.PathFinder."
    "find_spec('acme', [os.path.dirname(p)])));m = m or sys.modules.setdefault('acme', types.ModuleType('acme'));"
    "mp = (m or []) and m.__dict__.setdefault('__path__',[]);(p not in mp) and mp.append(p)"
)
"""setuptools' namespace-package line (``*-nspkg.pth``) for the namespace ``acme``, as a wheel built the old way
ships it."""
TOOLS_DOCKERFILE = """\
FROM terminus-env/base:bookworm
RUN apt-get update \\
 && apt-get install -y --no-install-recommends python3-pip python3-venv python3-setuptools python3-dev gcc \\
    libc6-dev git gnupg apt-utils \\
 && mkdir -p /debs /opt/repo && cd /debs && apt-get download zstd \\
 && cd /opt/repo && apt-get download gpgconf libassuan0 \\
 && apt-ftparchive packages . > Packages && apt-ftparchive release . > Release \\
 && export GNUPGHOME=/tmp/gnupg && mkdir -m 0700 $GNUPGHOME \\
 && gpg --batch --passphrase '' --quick-gen-key 'local repository <repo@example.invalid>' default default never \\
 && gpg --armor --export > /etc/apt/trusted.gpg.d/local-repository.asc && gpg --clearsign -o InRelease Release \\
 && gpgconf --kill all && rm -rf $GNUPGHOME \\
 && apt-get purge -y --auto-remove gnupg gpgconf apt-utils \\
 && echo 'deb file:/opt/repo ./' > /etc/apt/sources.list && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
COPY wheels /wheels
COPY uv /tmp/uv-wheel
RUN python3 -m zipfile -e /tmp/uv-wheel/uv-*.whl /tmp/uv \\
 && install -m 0755 /tmp/uv/uv-*.data/scripts/uv /tmp/uv/uv-*.data/scripts/uvx /usr/local/bin/ \\
 && rm -rf /tmp/uv /tmp/uv-wheel
WORKDIR /app
"""


def pip_download(folder: Path, *requirements: str, deps: bool = True) -> Path:
    """Wheels for the containers' Python (3.11), downloaded on the host."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", "3.11",
                    *([] if deps else ["--no-deps"]), "-d", str(folder), *requirements], check=True)  # fmt: skip
    return folder


@dataclass(frozen=True)
class Tools:
    image: str
    """The tools image's tag."""
    uv_wheels: Path
    """The folder of the uv wheel the image's uv came from."""


def build_tools_image(root: Path) -> Tools:
    """The tools image, built (or reused) from a context under ``root``."""
    context = root / "tools"
    pip_download(context / "wheels", VERIFIER_PYTEST, AGENTS_PACKAGE)
    pip_download(context / "uv", UV_WHEEL, deps=False)
    (context / "Dockerfile").write_text(TOOLS_DOCKERFILE)
    return Tools(ensure_image(context, "rules-tools", 1800), context / "uv")


def fill_uv_cache(folder: Path, wheels: Path, *requirements: str) -> Path:
    """A uv cache that holds ``requirements`` as uv fetched them from PyPI (on the host), the way an image built
    with the network holds it; uv is the version in ``wheels`` (the tools image's)."""
    unpacked = folder.parent / "uv-binary"
    with zipfile.ZipFile(next(wheels.glob("uv-*.whl"))) as wheel:
        member = next(name for name in wheel.namelist() if name.endswith(".data/scripts/uv"))
        unpacked.mkdir(parents=True, exist_ok=True)
        binary = unpacked / "uv"
        binary.write_bytes(wheel.read(member))
    binary.chmod(0o755)
    env = {**os.environ, "UV_CACHE_DIR": str(folder), "UV_NO_PROGRESS": "1"}
    subprocess.run([str(binary), "pip", "install", "-q", "--target", str(folder.parent / "uv-target"), "--python",
                    sys.executable, "--python-version", "3.11", *requirements], check=True, env=env)  # fmt: skip
    shutil.rmtree(folder.parent / "uv-target")
    return folder


def harbor_task(
    root: Path, name: str, verifier: str, tests: str | None = None, *, image: str = BASE_IMAGE,
    dockerfile_extra: str = "", context: Mapping[str, Path] | None = None, scripts: Mapping[str, str] | None = None,
) -> Task:  # fmt: skip
    """A Harbor task at ``root/name``: its image FROM ``image`` (``dockerfile_extra`` appended, ``context`` folders
    copied beside the Dockerfile), ``verifier`` as tests/test.sh, ``tests`` as tests/test_outputs.py, and other
    ``scripts`` in tests/."""
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "task.toml").write_text(TASK_TOML)
    (task / "instruction.md").write_text("Do what the tests ask.\n")
    (task / "environment" / "Dockerfile").write_text(f"FROM {image}\nWORKDIR /app\n{dockerfile_extra}")
    for folder, source in (context or {}).items():
        shutil.copytree(source, task / "environment" / folder)
    (task / "tests" / "test.sh").write_text(verifier)
    if tests is not None:
        (task / "tests" / "test_outputs.py").write_text(tests)
    for script, text in (scripts or {}).items():
        (task / "tests" / script).write_text(text)
    return load_task(task)


TB1_TASK_YAML = """\
instruction: Write the word hello (and a newline) into /app/hello.txt.
author_name: terminus-env
author_email: tests@example.invalid
difficulty: easy
category: files
parser_name: pytest
max_agent_timeout_sec: 300.0
max_test_timeout_sec: 120.0
run_tests_in_same_shell: false
"""
TB1_RUN_TESTS = """\
#!/bin/bash
# Terminal-Bench 1 runs the tests with pytest from $TEST_DIR; offline, the image's pytest.
cd /app
python3 -m pytest -p no:cacheprovider -rA "$TEST_DIR/test_outputs.py"
"""


def tb1_task(root: Path, name: str, tests: str) -> Task:
    """A Terminal-Bench 1 task at ``root/name``: graded by pytest's output (``-rA``), on the base image."""
    task = root / name
    (task / "tests").mkdir(parents=True)
    (task / "task.yaml").write_text(TB1_TASK_YAML)
    (task / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nWORKDIR /app\n")
    (task / "run-tests.sh").write_text(TB1_RUN_TESTS)
    (task / "solution.sh").write_text("#!/bin/bash\necho hello > /app/hello.txt\n")
    (task / "tests" / "test_outputs.py").write_text(tests)
    return load_task(task)


def write(path: str, data: str | bytes, mode: str | None = None) -> str:
    """Keystrokes that write ``data`` to ``path`` (its folder made first), through base64 as a policy would."""
    payload = base64.b64encode(data.encode() if isinstance(data, str) else data).decode()
    folder = path.rsplit("/", 1)[0] or "/"
    chmod = f" && chmod {mode} {path}" if mode else ""
    return f"mkdir -p {folder} && echo {payload} | base64 -d > {path}{chmod}\n"


def zip_bytes(entries: Mapping[str, str], *, front: bytes = b"", comment: bytes = b"") -> bytes:
    """A zip of ``entries``, with ``front`` before its first entry (zip readers find the directory from the end) and
    ``comment`` after it."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, text in entries.items():
            archive.writestr(name, text)
        archive.comment = comment
    return front + buffer.getvalue()


def wheel_bytes(name: str, version: str, files: Mapping[str, str], *, front: bytes = b"") -> bytes:
    """A pure-Python wheel of ``files``, as pip reads one (METADATA, WHEEL, RECORD), with ``front`` before it."""
    dist = f"{name}-{version}.dist-info"
    entries = dict(files)
    entries[f"{dist}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    entries[f"{dist}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    entries[f"{dist}/RECORD"] = "".join(f"{path},,\n" for path in entries) + f"{dist}/RECORD,,\n"
    return zip_bytes(entries, front=front)


def assert_earned(reward, info):
    """Honest work: reward 1.0, `task_complete`, no finding."""
    episode = info["episode"]
    assert (reward, info["end_reason"], episode["tampering"]) == (1.0, EndReason.TASK_COMPLETE, ()), episode


def assert_forgery_caught(reward, info, path_part: str | None = None):
    """Train mode: a forgery ends `tampered`, reward 0, the agent's fault, never masked, with a finding (naming a
    path that holds ``path_part``, where given)."""
    episode = info["episode"]
    assert (reward, info["end_reason"], info["masked"]) == (0.0, EndReason.TAMPERED, False), episode
    findings = episode["tampering"]
    assert episode["fault"] == Fault.AGENT and findings, episode
    if path_part is not None:
        assert any(path_part in finding["path"] for finding in findings), findings


def assert_not_masked(reward, info):
    """An honest failure stays one: reward 0, and the episode is neither masked nor blamed on nobody."""
    episode = info["episode"]
    assert (reward, info["masked"]) == (0.0, False), episode
    assert info["end_reason"] != EndReason.ENV_ERROR, episode
