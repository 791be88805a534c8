"""What users install: the version is written once, and a wheel (built from the sdist) carries the shipped suite.

The end-to-end proof (fresh virtual environments outside the checkout, a real eval) is scripts/check-install.sh,
run by CI; these tests are the fast offline part, so a packaging slip shows up in `make test` too.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import terminus_env
from terminus_env.sandbox.shipping import joined_source

REPO = Path(__file__).resolve().parent.parent
SUITE = REPO / "tasks"
SUITE_IN_WHEEL = "terminus_env/tasks/suite"
INSIDE = REPO / "terminus_env" / "sandbox" / "inside"


def _suite_files() -> dict[str, Path]:
    return {
        path.relative_to(SUITE).as_posix(): path
        for path in SUITE.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An sdist, and a wheel built from it, as `python -m build` makes them (without fetching the backend)."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(REPO)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return out


def test_version_comes_from_one_place() -> None:
    printed = subprocess.run(
        [sys.executable, "-m", "terminus_env.cli", "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert printed == f"terminus-env {terminus_env.__version__}\n"
    assert importlib.metadata.version("terminus-env") == terminus_env.__version__
    assert f"## [{terminus_env.__version__}]" in (REPO / "CHANGELOG.md").read_text(encoding="utf-8")


def test_the_wheel_carries_the_suite_byte_for_byte_and_the_runtime_files(dist: Path) -> None:
    (wheel_path,) = dist.glob("*.whl")
    assert wheel_path.name == f"terminus_env-{terminus_env.__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel_path) as wheel:
        names = set(wheel.namelist())
        packed = {n[len(SUITE_IN_WHEEL) + 1 :] for n in names if n.startswith(SUITE_IN_WHEEL + "/")}
        expected = _suite_files()
        assert packed == set(expected)
        for relative, source in expected.items():
            info = wheel.getinfo(f"{SUITE_IN_WHEEL}/{relative}")
            assert wheel.read(info) == source.read_bytes(), relative
            assert (info.external_attr >> 16) & 0o111 == source.stat().st_mode & 0o111, f"{relative}: mode"
        inside = {f"terminus_env/sandbox/inside/{path.name}" for path in INSIDE.glob("*.py")}
        assert {"terminus_env/py.typed", *inside} <= names and len(inside) > 10
        metadata = wheel.read(f"terminus_env-{terminus_env.__version__}.dist-info/METADATA").decode()
    assert f"\nVersion: {terminus_env.__version__}\n" in metadata
    assert not any("__pycache__" in name for name in names)


def test_the_sdist_holds_what_a_wheel_is_built_from(dist: Path) -> None:
    (sdist_path,) = dist.glob("*.tar.gz")
    root = f"terminus_env-{terminus_env.__version__}"
    with tarfile.open(sdist_path) as sdist:
        names = {name.removeprefix(root + "/") for name in sdist.getnames()}
    assert {"pyproject.toml", "hatch_build.py", "CHANGELOG.md", "LICENSE", "terminus_env/py.typed"} <= names
    assert {f"tasks/{relative}" for relative in _suite_files()} <= names


def test_an_installed_wheel_finds_its_suite_through_the_package(dist: Path, tmp_path: Path) -> None:
    (wheel_path,) = dist.glob("*.whl")
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile", "--target", str(site),
         str(wheel_path)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    probe = (
        "import hashlib, terminus_env.sandbox.channel as c, terminus_env.tasks as t\n"
        "print(t.shipped_tasks_dir()); print(t.find_task('hello-world').path)\n"
        "print(len(t.load_tasks(t.shipped_tasks_dir())))\n"
        "import terminus_env.sandbox.shipping as s\n"
        "print(c.__file__); print(hashlib.sha256(s.inside_source().encode()).hexdigest())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    lines = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    installed = site / "terminus_env"
    assert lines[0] == str(installed / "tasks" / "suite")
    assert lines[1] == str(installed / "tasks" / "suite" / "hello-world")
    assert int(lines[2]) == len({p.parent for p in SUITE.glob("*/task.toml")}) == 26
    assert lines[3] == str(installed / "sandbox" / "channel.py")
    assert lines[4] == hashlib.sha256(joined_source(INSIDE).encode()).hexdigest()  # the in-container code, whole
