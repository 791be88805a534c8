"""The first failing test of a verification, read from real pytest output and real CTRF reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from terminus_env.tasks.grading import FAILURE_CAP, first_failure

TESTS = '''
import pytest

def test_passes():
    assert True

class TestReport:
    @pytest.mark.parametrize("n", [1, 2])
    def test_count(self, n):
        counts = {"rows": n}
        assert counts == {"rows": 1}, f"expected 1 row in /app/out.csv, found {n} after reading the whole file"

def test_later_failure():
    raise ValueError("never reached first")

@pytest.fixture
def server():
    raise ConnectionRefusedError("nothing listens on port 8080")

def test_needs_server(server):
    pass
'''

FIRST = "test_verifier.py::TestReport::test_count[2]"
ASSERTION = "AssertionError: expected 1 row in /app/out.csv, found 2 after reading the whole file"


def run_pytest(tmp_path: Path, source: str, *flags: str) -> tuple[str, bytes | None]:
    """Run the image-side verifier's tool for real: pytest on a test file, optionally with a CTRF report.

    The width is pinned to an 80-column terminal, as in a verifier's container. A CI runner's wide ``COLUMNS``,
    or its ``CI``/``BUILD_NUMBER`` variables (pytest then never cuts summary lines), would leave the lines uncut.
    """
    env = {key: value for key, value in os.environ.items() if key not in ("CI", "BUILD_NUMBER")}
    (tmp_path / "test_verifier.py").write_text(source)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *flags, "test_verifier.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False, env={**env, "COLUMNS": "80"},
    )  # fmt: skip
    ctrf = tmp_path / "ctrf.json"
    return result.stdout + result.stderr, ctrf.read_bytes() if ctrf.exists() else None


@pytest.fixture(scope="module")
def verifier_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, bytes | None]:
    """One verifier run as Terminal-Bench 2 tasks make it: ``-rA`` and a CTRF report."""
    return run_pytest(tmp_path_factory.mktemp("verifier"), TESTS, "-rA", "--ctrf", "ctrf.json")


def test_pytest_output_names_the_first_failure_with_its_whole_assertion(verifier_run: tuple[str, bytes]) -> None:
    output, _ = verifier_run
    summary_line = next(line for line in output.splitlines() if line.startswith(f"FAILED {FIRST}"))
    assert summary_line.endswith("...") and "whole file" not in summary_line  # cut to the terminal's width
    assert "ERROR test_verifier.py::test_needs_server" in output  # listed before the failures, yet ran after
    assert first_failure(output) == f"{FIRST}: {ASSERTION}"


def test_pytest_default_summary_is_enough(tmp_path: Path) -> None:
    output, _ = run_pytest(tmp_path, TESTS)
    assert "PASSED" not in output and first_failure(output) == f"{FIRST}: {ASSERTION}"


def test_a_ctrf_report_comes_first(verifier_run: tuple[str, bytes]) -> None:
    _, ctrf = verifier_run
    assert ctrf is not None and json.loads(ctrf)["results"]["summary"]["failed"] == 3
    assert first_failure("", ctrf) == f"{FIRST}: {ASSERTION}"
    assert first_failure("unrelated output with no pytest in it", ctrf) == f"{FIRST}: {ASSERTION}"


def test_a_broken_ctrf_report_falls_back_to_the_output(verifier_run: tuple[str, bytes]) -> None:
    output, _ = verifier_run
    for broken in (b"{not json", b'{"results": {}}', b'{"results": {"tests": [{"status": "passed", "name": "x"}]}}'):
        assert first_failure(output, broken) == f"{FIRST}: {ASSERTION}"


def test_only_setup_errors_name_the_erroring_test(tmp_path: Path) -> None:
    source = TESTS.split("class TestReport")[0] + TESTS.split("raise ValueError(\"never reached first\")")[1]
    output, _ = run_pytest(tmp_path, source, "-rA")
    expected = "test_verifier.py::test_needs_server: ConnectionRefusedError: nothing listens on port 8080"
    assert first_failure(output) == expected


def test_a_passing_run_or_other_output_has_no_failure(tmp_path: Path) -> None:
    output, ctrf = run_pytest(tmp_path, "def test_ok():\n    assert 1\n", "-rA", "--ctrf", "ctrf.json")
    assert "1 passed" in output and first_failure(output, ctrf) is None
    assert first_failure("cat: /app/out.csv: No such file or directory\n") is None


def test_a_long_assertion_is_cut_between_words(tmp_path: Path) -> None:
    words = " ".join(f"word{i}" for i in range(200))
    output, _ = run_pytest(tmp_path, f"def test_long():\n    assert False, '{words}'\n", "-rA")
    failure = first_failure(output)
    assert failure is not None and len(failure) <= FAILURE_CAP and failure.endswith("…")
    assert failure.startswith("test_verifier.py::test_long: AssertionError: word0 word1")
    last_word = failure.removesuffix("…").split()[-1]
    assert last_word in words.split()  # a whole word, never one cut in the middle
