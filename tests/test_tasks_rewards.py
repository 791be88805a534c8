"""Reading rewards from verifier files and pytest output, without Docker."""

from __future__ import annotations

import pytest

from terminus_env.tasks.grading import parse_reward_json, parse_reward_txt, pytest_reward

RA_OUTPUT = """============================= test session starts ==============================
collected 2 items

test_outputs.py .F                                                       [100%]
=========================== short test summary info ============================
PASSED test_outputs.py::test_a
{second} test_outputs.py::test_b - assert False
========================= 1 failed, 1 passed in 0.02s =========================
"""


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"1\n", 1.0), (b" 0.5 ", 0.5), (b"0", 0.0), (b".25", 0.25), (b"nan", 0.0), (b"one", 0.0), (b"\xff", 0.0),
        (b"", 0.0), (b"1_0", 0.0), (b"1e0", 1.0), (b"inf", 0.0), (b"2", 0.0), (b"-0.5", 0.0), (b"0x1", 0.0),
    ],
)  # fmt: skip
def test_reward_txt_is_a_decimal_in_the_unit_interval(data: bytes, expected: float) -> None:
    reward, reason = parse_reward_txt(data)
    assert reward == expected
    refused = {b"nan", b"one", b"\xff", b"", b"1_0", b"inf", b"2", b"-0.5", b"0x1"}
    assert (reason is None) == (data.strip() not in refused)


@pytest.mark.parametrize(
    ("data", "expected", "ok"),
    [
        (b'{"reward": 0.2, "other": 1}', 0.2, True),
        # beside a reward key, counters and notes are the verifier's own business (Harbor's verifiers write them)
        (b'{"reward": 1.0, "visible_passed": 7, "hidden_passed": 3, "hidden_total": 3}', 1.0, True),
        (b'{"reward": 0.5, "note": "half", "detail": {"a": [1, 2]}, "ok": true, "ratio": NaN, "n": -4}', 0.5, True),
        (b'{"reward": 0, "big": ' + b"9" * 400 + b"}", 0.0, True),
        # the reward itself is judged as ever
        (b'{"reward": 1.5, "passed": 7}', 0.0, False),
        (b'{"reward": -0.1}', 0.0, False),
        (b'{"reward": NaN}', 0.0, False),
        (b'{"reward": Infinity, "passed": 1}', 0.0, False),
        (b'{"reward": "1"}', 0.0, False),
        (b'{"reward": true}', 0.0, False),
        (b'{"reward": null, "passed": 1}', 0.0, False),
        (b'{"reward": ' + b"9" * 400 + b"}", 0.0, False),
        # without one: the mean of the values, every one a number in [0, 1]
        (b'{"a": 1, "b": 0}', 0.5, True),
        (b'{"a": 1, "b": 0.5, "c": 0}', 0.5, True),
        (b'{"a": true}', 0.0, False),
        (b'{"a": 1, "passed": 7}', 0.0, False),
        (b'{"a": 1, "b": -1}', 0.0, False),
        (b'{"a": 1, "b": NaN}', 0.0, False),
        (b'{"a": 1, "note": "x"}', 0.0, False),
        (b"[1, 2]", 0.0, False),
        (b"{}", 0.0, False),
        (b"{", 0.0, False),
        (b"[" * 100_000, 0.0, False),
    ],
)
def test_reward_json(data: bytes, expected: float, ok: bool) -> None:
    reward, reason = parse_reward_json(data)
    assert reward == expected and (reason is None) == ok


def test_pytest_all_passed_from_ra_lines() -> None:
    assert pytest_reward(RA_OUTPUT.replace("{second}", "PASSED")) == (1.0, None)


def test_captured_log_lines_of_passing_tests_are_not_outcomes() -> None:
    """`-rA` prints each passing test's captured log, whose level begins the line: an ERROR logged by a passing test
    is no failed test. Only the short summary's own lines are outcomes."""
    logged = RA_OUTPUT.replace("{second}", "PASSED").replace(
        "=========================== short test summary info",
        "==================================== PASSES ====================================\n"
        "------------------------------ Captured log call -------------------------------\n"
        "ERROR    traitlets:__init__.py:98 Notebook JSON is invalid: Additional properties are not allowed\n"
        "FAILED   loader:load.py:12 a log line shaped like an outcome\n"
        "=========================== short test summary info",
    )  # fmt: skip
    assert pytest_reward(logged) == (1.0, None)
    # the same lines outside any summary, with a failure in it, still fail
    assert pytest_reward(logged.replace("PASSED test_outputs.py::test_b", "FAILED test_outputs.py::test_b"))[0] == 0.0


def test_pytest_one_failure_from_ra_lines() -> None:
    reward, reason = pytest_reward(RA_OUTPUT.replace("{second}", "FAILED"))
    assert reward == 0.0 and "1 of 2 tests failed" in (reason or "")


@pytest.mark.parametrize(
    ("summary", "expected"),
    [
        ("===== 3 passed in 0.10s =====", 1.0),
        ("===== 2 passed, 1 skipped in 0.10s =====", 1.0),
        ("===== 1 failed, 2 passed in 0.10s =====", 0.0),
        ("===== 2 passed, 1 error in 0.10s =====", 0.0),
        ("===== 1 skipped in 0.01s =====", 0.0),
        ("bash: pytest: command not found", 0.0),
    ],
)
def test_pytest_summary_line(summary: str, expected: float) -> None:
    assert pytest_reward(f"some output\n{summary}\n")[0] == expected
