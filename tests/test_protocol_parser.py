"""The Terminus 2 reply parser: a corpus of replies with known outcomes, and the rules one by one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from terminus_env.protocol import (
    MAX_COMMAND_DURATION,
    Command,
    Issue,
    ParsedReply,
    parse_reply,
    salvage_truncated,
)

CORPUS = json.loads((Path(__file__).parent / "data" / "protocol_parser_corpus.json").read_text(encoding="utf-8"))
CASES = CORPUS["cases"]


def reply(*commands: str, complete: str = "") -> str:
    return (
        "<response>\n<analysis>a</analysis>\n<plan>p</plan>\n<commands>\n"
        + "".join(commands)
        + "</commands>\n"
        + complete
        + "</response>"
    )


def test_corpus_is_large_and_documents_every_difference_from_harbor():
    assert len(CASES) >= 50
    assert len({case["name"] for case in CASES}) == len(CASES)
    differing = [case for case in CASES if case["harbor"].startswith("differs")]
    assert differing, "the corpus should show where we differ from Harbor on purpose"
    assert all(": " in case["harbor"] for case in differing), "each difference needs a reason"
    assert sum(case["rejected"] for case in CASES) >= 5


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_corpus_case(case):
    parsed = parse_reply(case["reply"])
    assert parsed.rejected == case["rejected"]
    assert (parsed.error_kind.value if parsed.error_kind else None) == case["error_kind"]
    assert parsed.task_complete == case["task_complete"]
    assert [[c.keystrokes, c.duration] for c in parsed.commands] == case["commands"]
    assert sorted({kind.value for kind in parsed.warning_kinds}) == case["warning_kinds"]
    assert len(parsed.warnings) == len(parsed.warning_kinds)
    assert all(isinstance(w, str) and w.strip() for w in parsed.warnings)


def test_canonical_reply_reads_every_field():
    text = reply(
        '<keystrokes duration="0.1">cat > a.sh <<EOF\nif [ 1 < 2 ] && echo "x"; then :; fi\nEOF\n</keystrokes>\n',
        '<keystrokes duration="3">bash a.sh\n</keystrokes>\n',
        complete="<task_complete>false</task_complete>\n",
    )
    parsed = parse_reply(text)
    assert parsed == ParsedReply(
        commands=(
            Command('cat > a.sh <<EOF\nif [ 1 < 2 ] && echo "x"; then :; fi\nEOF\n', 0.1),
            Command("bash a.sh\n", 3.0),
        ),
        task_complete=False,
        error=None,
        warnings=[],
        analysis="a",
        plan="p",
    )
    assert not parsed.rejected


def test_rejection_messages_say_what_to_do():
    no_response = parse_reply("ls -la")
    assert no_response.rejected and no_response.error_kind is Issue.NO_RESPONSE
    assert "<response>" in no_response.error
    no_commands = parse_reply("<response><analysis>a</analysis><plan>p</plan></response>")
    assert no_commands.rejected and no_commands.error_kind is Issue.NO_COMMANDS
    assert "<commands>" in no_commands.error and "complete" in no_commands.error
    misplaced = parse_reply('<response><keystrokes duration="1">ls\n</keystrokes></response>')
    assert "inside <commands>" in misplaced.error
    assert misplaced.commands == ()


def test_task_complete_values():
    def done(section: str) -> bool:
        return parse_reply(reply(complete=section)).task_complete

    assert done("<task_complete>true</task_complete>")
    assert done("<task_complete> True\n</task_complete>")
    assert done("<task_complete>TRUE</task_complete>")
    assert not done("<task_complete>false</task_complete>")
    assert not done("<task_complete></task_complete>")
    assert not done("<task_complete/>")
    assert not done("<task_complete>true!</task_complete>")
    assert not done("")
    assert not done("<task_complete>true")  # never closed


def test_durations_default_cap_and_warn():
    parsed = parse_reply(
        reply(
            "<keystrokes>a\n</keystrokes>",
            '<keystrokes duration="soon">b\n</keystrokes>',
            '<keystrokes duration="90">c\n</keystrokes>',
            '<keystrokes duration="0.25">d\n</keystrokes>',
        )
    )
    assert [c.duration for c in parsed.commands] == [1.0, 1.0, 90.0, 0.25]
    assert [c.capped_duration for c in parsed.commands] == [1.0, 1.0, MAX_COMMAND_DURATION, 0.25]
    assert MAX_COMMAND_DURATION == 60.0
    assert parsed.warning_kinds == (Issue.MISSING_DURATION, Issue.INVALID_DURATION, Issue.DURATION_CAPPED)
    assert "Command 1" in parsed.warnings[0] and "Command 2" in parsed.warnings[1] and "soon" in parsed.warnings[1]


def test_attribute_faults_are_reported_with_the_xml_reason():
    parsed = parse_reply(reply('<keystrokes duration=2 retries="3">make\n</keystrokes>'))
    assert parsed.commands == (Command("make\n", 1.0),)
    assert Issue.BAD_ATTRIBUTES in parsed.warning_kinds and Issue.MISSING_DURATION in parsed.warning_kinds
    bad = parsed.warnings[parsed.warning_kinds.index(Issue.BAD_ATTRIBUTES)]
    assert 'name="value"' in bad and "lxml" in bad
    unknown = parse_reply(reply('<keystrokes duration="2" retries="3">make\n</keystrokes>'))
    assert unknown.commands == (Command("make\n", 2.0),)
    assert unknown.warning_kinds == (Issue.UNKNOWN_ATTRIBUTE,)
    assert "retries" in unknown.warnings[0]


@pytest.mark.parametrize("spelled", ["1_0", "inf", "nan", "infinity", "0x10", "1,5", " "])
def test_durations_are_decimals_not_whatever_float_accepts(spelled):
    parsed = parse_reply(reply(f'<keystrokes duration="{spelled}">ls\n</keystrokes>'))
    assert parsed.commands == (Command("ls\n", 1.0),)
    assert parsed.warning_kinds == (Issue.INVALID_DURATION,)


def test_each_attribute_fault_quotes_its_own_xml_reason():
    """lxml keeps every error in the shared parser's log: each reply must quote its own, not the first one seen."""
    first = parse_reply(reply('<keystrokes duration="1" foo>a\n</keystrokes>')).warnings[0]
    second = parse_reply(reply('<keystrokes duration="1" c="d" c="e">a\n</keystrokes>')).warnings[0]
    assert "value for attribu" in first and "redefined" in second and "value for attribu" not in second


def test_keystrokes_are_not_stripped_or_decoded():
    keys = "  printf '%s' \"&amp; &lt;tag&gt; && a<b>c\" | tee -a out  \n\n"
    parsed = parse_reply(reply(f'<keystrokes duration="0.1">{keys}</keystrokes>'))
    assert parsed.commands[0].keystrokes == keys
    assert parsed.warning_kinds == (Issue.ENTITY,)
    assert "&amp;" in parsed.warnings[0] and "&lt;" in parsed.warnings[0]


def test_tags_typed_inside_keystrokes_are_text():
    heredoc = (
        "cat > r.xml <<'EOF'\n<response><commands></commands></response>\n<task_complete>true</task_complete>\nEOF\n"
    )
    parsed = parse_reply(
        reply(f'<keystrokes duration="0.5">{heredoc}</keystrokes>\n', '<keystrokes duration="1">ls\n</keystrokes>\n')
    )
    assert [c.keystrokes for c in parsed.commands] == [heredoc, "ls\n"]
    assert not parsed.task_complete
    assert parsed.warnings == []


def test_newline_warning_only_between_commands_and_not_for_key_chords():
    parsed = parse_reply(
        reply(
            '<keystrokes duration="1">vim a.txt</keystrokes>',
            '<keystrokes duration="1">C-c</keystrokes>',
            '<keystrokes duration="1">echo last</keystrokes>',
        )
    )
    assert parsed.warning_kinds == (Issue.MISSING_NEWLINE,)
    assert "Command 1" in parsed.warnings[0]


def test_silent_no_op_and_empty_commands_are_warnings_not_errors():
    no_op = parse_reply(reply("ls -la\n"))
    assert not no_op.rejected and no_op.commands == ()
    assert no_op.warning_kinds == (Issue.NO_KEYSTROKES,)
    empty = parse_reply(reply())
    assert not empty.rejected and empty.warning_kinds == (Issue.EMPTY_COMMANDS,)
    finished = parse_reply(reply(complete="<task_complete>true</task_complete>"))
    assert finished.task_complete and finished.warnings == []


def test_several_responses_execute_only_the_first():
    parsed = parse_reply(
        reply('<keystrokes duration="1">echo 1\n</keystrokes>')
        + reply('<keystrokes duration="1">echo 2\n</keystrokes>')
    )
    assert parsed.commands == (Command("echo 1\n", 1.0),)
    assert Issue.MULTIPLE_RESPONSES in parsed.warning_kinds
    assert "2" in parsed.warnings[parsed.warning_kinds.index(Issue.MULTIPLE_RESPONSES)]


def test_never_raises_on_harbors_crash_input():
    parsed = parse_reply(reply('<keystrokes duration="1">if a < > b; then :; fi\n</keystrokes>'))
    assert parsed.commands == (Command("if a < > b; then :; fi\n", 1.0),)
    for text in ("< >", "<response>< >", "<response><commands>< ></commands>", "<response><a < > b>"):
        assert isinstance(parse_reply(text), ParsedReply)


def test_non_text_input_is_a_clear_type_error():
    with pytest.raises(TypeError, match="decode it first"):
        parse_reply(b"<response></response>")


@pytest.mark.timeout(120)  # a hang guard: a quadratic scan would take hours on these inputs
def test_multi_megabyte_reply_is_parsed_exactly():
    payload = "echo " + ("x<y>&z " * 400_000) + "\n"  # 2.8 MB of keystrokes
    text = reply(f'<keystrokes duration="2">{payload}</keystrokes>') + "<" * 200_000 + "<a>" * 100_000
    parsed = parse_reply(text)
    assert parsed.commands == (Command(payload, 2.0),)
    assert Issue.TEXT_AFTER_RESPONSE in parsed.warning_kinds


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "text",
    [
        "<response>" + "<commands>" * 200_000,
        "<response>" + "<task_complete>" * 200_000 + "</task_complete>",
        "<response>" + "".join(f"<t{i}>" for i in range(100_000)),
        "<response><commands>" + "<keystrokes>" * 200_000,
        "<response><commands>" + '<keystrokes duration="1"/>' * 100_000 + "</commands>",
    ],
    ids=["commands", "task_complete", "distinct-tags", "open-keystrokes", "self-closing"],
)
def test_pathological_repeats(text):
    parsed = parse_reply(text)
    assert len(parsed.warnings) <= 10  # a repeated tag is one warning, not one per repeat


def test_salvage_cuts_at_the_first_response_end_after_commands():
    good = reply('<keystrokes duration="1">ls\n</keystrokes>\n')
    assert salvage_truncated(good + "\n<response><analysis>and then I kept going") == good
    assert salvage_truncated(good) == good
    assert salvage_truncated("<response><analysis>a</analysis><commands><keystrokes>ls") is None
    assert salvage_truncated("<response><commands></commands>") is None  # no </response> after </commands>
    assert salvage_truncated("<commands></commands></response>") is None  # no <response>: rejected
    two_blocks = (
        "<response><analysis>a</analysis><plan>p</plan><commands></commands>"
        "<commands><keystrokes>rm -rf /tmp/x\n</keystrokes></commands></response> more"
    )
    assert salvage_truncated(two_blocks) is None


def test_a_decimal_beside_a_control_character_python_calls_a_space_never_raises():
    """``\\s`` takes the separators ``\\x1c``-``\\x1f``, ``float()`` does not: found by the mutated-replies property."""
    from terminus_env.utils.plain_numbers import read_decimal

    assert read_decimal("\x1f2") == 2.0 and read_decimal("2\x1c") == 2.0
