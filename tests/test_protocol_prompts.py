"""Observation wording: each message carries the facts the model needs (task, screen, errors, warnings)."""

from __future__ import annotations

import pytest

from terminus_env.protocol import (
    cap_output,
    confirm_completion_prompt,
    initial_prompt,
    output_feedback,
    parse_reply,
    rejected_feedback,
    truncated_feedback,
)


def test_initial_prompt_holds_rules_task_and_screen():
    prompt = initial_prompt("Compile hello.c into ./hello.", "root@box:/app# ")
    for fact in (
        "<response>",
        "<analysis>",
        "<plan>",
        "<commands>",
        "<keystrokes",
        "duration",
        "C-c",
        "C-d",
        "<task_complete>true</task_complete>",
        "60 seconds",
        "confirm",
        "&amp;",
    ):
        assert fact in prompt, fact
    assert prompt.index("Compile hello.c into ./hello.") < prompt.index("root@box:/app# ")
    assert prompt.endswith("root@box:/app# ")


def test_rejected_feedback_lists_error_and_warnings_and_says_nothing_ran():
    parsed = parse_reply("Sure! Here you go.\n<analysis>a</analysis>")
    text = rejected_feedback(parsed)
    assert parsed.error in text and "parsing errors" in text and "none of its commands ran" in text
    with_warnings = parse_reply("note\n<response><analysis>a</analysis></response>")
    text = rejected_feedback(with_warnings)
    assert with_warnings.error in text
    assert all(warning in text for warning in with_warnings.warnings) and with_warnings.warnings


def test_output_feedback_puts_warnings_before_the_output():
    text = output_feedback("total 0\n", ["Missing <plan> section."])
    assert text.index("Missing <plan> section.") < text.index("total 0")
    assert "New terminal output" in text
    plain = output_feedback("total 0\n", [])
    assert "WARNING" not in plain and plain.endswith("total 0\n")
    screen = output_feedback("$ ", [], is_screen=True)
    assert "Current terminal screen" in screen and "New terminal output" not in screen


def test_confirm_completion_asks_and_explains_grading():
    text = confirm_completion_prompt("done\n")
    assert "done\n" in text and "Are you sure" in text and "graded" in text
    assert "<task_complete>true</task_complete>" in text
    assert "Current terminal screen" in confirm_completion_prompt("$ ", is_screen=True)


def test_truncated_feedback_names_the_limit():
    text = truncated_feedback(16384)
    assert "16384" in text and "none of its actions ran" in text


def test_cap_output_keeps_both_ends_and_counts_the_rest():
    short = "ok\n" * 100
    assert cap_output(short) == short
    exactly = "a" * 10_000
    assert cap_output(exactly) == exactly
    text = "H" * 6_000 + "M" * 3_000 + "T" * 6_000
    capped = cap_output(text)
    assert capped.startswith("H" * 5_000) and capped.endswith("T" * 5_000)
    assert "5000" in capped and "omitted" in capped and "M" not in capped
    assert len(cap_output(text, limit=100).encode()) < 200


def test_cap_output_rejects_a_useless_limit():
    with pytest.raises(ValueError, match="at least one byte at each end"):
        cap_output("x", limit=1)
