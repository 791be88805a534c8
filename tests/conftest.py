"""Shared fixtures. Docker tests skip without an engine, but fail under TERMINUS_REQUIRE_DOCKER=1 (CI)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from require import REQUIRE_DOCKER
from shapes_support import Tools, build_tools_image
from task_support import TINY_TOML

from terminus_env.config import env_flag

ADAPTER_TESTS = Path(__file__).parent / "adapters"
VLLM_TESTS = Path(__file__).parent / "real_vllm"
COMPAT_TASKS = Path(__file__).parent / "compat"
"""The compatibility suite's tasks: their own tests are written for the task's container, where test_compat.py
runs them."""


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C as a terminal sends it, whoever started the run: a run started in the background (a job of a
    non-interactive shell, nohup) inherits SIGINT ignored, and Python then leaves it ignored, in itself and in every
    child it starts. The tests that interrupt a call, or stop a child with SIGINT, need Python's own handler here
    (a child's exec then resets it to the default)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--adapters",
        action="store_true",
        help="collect tests/adapters (each needs its RL library installed: a missing one fails, never skips)",
    )
    parser.addoption(
        "--vllm",
        action="store_true",
        help="collect tests/real_vllm: real vLLM replicas on the CPU (.venv-vllm; a missing vLLM fails, never skips)",
    )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The adapter tests run in each library's own environment (``make test-adapters``), and the real-vLLM tests in
    ``.venv-vllm`` (``make test-vllm``), not in the default run;
    the compatibility tasks' tests never run here."""
    if collection_path == COMPAT_TASKS:
        return True
    if collection_path == ADAPTER_TESTS and not config.getoption("--adapters"):
        return True
    if collection_path == VLLM_TESTS and not config.getoption("--vllm"):
        return True
    return None


def _docker_problem() -> str | None:
    try:
        import docker

        client = docker.from_env(timeout=10)
        client.ping()
        client.close()
    except Exception as exc:  # any failure to reach the engine
        return f"no Docker engine answers ({exc})"
    return None


def _require_docker() -> None:
    problem = _docker_problem()
    if problem is None:
        return
    if env_flag(REQUIRE_DOCKER, False):
        pytest.fail(f"{problem}; {REQUIRE_DOCKER}=1 makes this a failure, not a skip")
    pytest.skip(problem)


@pytest.fixture(scope="session")
def docker_required() -> None:
    """Depend on this (or mark the test ``docker``) in every test that needs a real Docker engine."""
    _require_docker()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """One meaning for ``docker``: a test that depends on ``docker_required``, directly or through another fixture,
    carries the marker, so ``-m "not docker"`` is a run without an engine."""
    for item in items:
        if "docker_required" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.docker)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked ``docker`` without the fixture gets the same check: skipped without an engine, or failed
    under TERMINUS_REQUIRE_DOCKER=1."""
    if item.get_closest_marker("docker") is not None and "docker_required" not in getattr(item, "fixturenames", ()):
        _require_docker()


TINY_TEST = """\
#!/bin/bash
mkdir -p /logs/verifier
if [ "$(cat /app/hello.txt 2>/dev/null)" = "hello" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""


@pytest.fixture(scope="session")
def tiny_task_dir(tmp_path_factory: pytest.TempPathFactory):
    """A minimal Harbor-format task: write 'hello' into /app/hello.txt."""
    root = tmp_path_factory.mktemp("tiny") / "tiny-hello"
    (root / "environment").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "solution").mkdir()
    (root / "task.toml").write_text(TINY_TOML)
    (root / "instruction.md").write_text("Write the word hello (and a newline) into /app/hello.txt.\n")
    (root / "environment" / "Dockerfile").write_text("FROM terminus-env/base:bookworm\nWORKDIR /app\n")
    (root / "tests" / "test.sh").write_text(TINY_TEST)
    (root / "solution" / "solve.sh").write_text("#!/bin/bash\necho hello > hello.txt\n")  # in WORKDIR /app
    return root


@pytest.fixture(scope="session")
def tools(docker_required, tmp_path_factory: pytest.TempPathFactory) -> Tools:
    """The image of the tools real tasks use (``shapes_support``), built once a session."""
    return build_tools_image(tmp_path_factory.mktemp("tools"))
