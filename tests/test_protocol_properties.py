"""Property tests: the parser never raises, whatever it is fed, and keystrokes come back byte-exact.

Together the tests below run more than 10,000 generated replies (see EXAMPLES).
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from terminus_env.protocol import Issue, ParsedReply, parse_reply, salvage_truncated

EXAMPLES = {"random": 2500, "soup": 2500, "mutated": 2500, "binary": 1000, "round_trip": 1500, "huge": 40}
assert sum(EXAMPLES.values()) >= 10_000

# fmt: off
FRAGMENTS = [
    "<response>", "</response>", "<analysis>", "</analysis>", "<plan>", "</plan>", "<commands>", "</commands>",
    "<commands/>", "<keystrokes>", "</keystrokes>", '<keystrokes duration="0.1">', "<keystrokes duration=5>",
    "<keystrokes duration='x'>", '<keystrokes duration="1" foo=bar>', '<keystrokes duration="2"/>', "<keystrokes",
    "<task_complete>", "</task_complete>", "<task_complete>true</task_complete>", "<task_complete/>", "TRUE", "<",
    ">", "< >", "/>", "&amp;", "&lt;", "&#0;", '"', "'", "=", "\n", "\r\n", " ", "\t", "\x00", "\ud800", "<foo bar",
    "</", "<!--", "<![CDATA[", "ls -la", "C-c", "<<EOF", "if a < > b", "\U0001f680",
]
# fmt: on
ANY_CHAR = st.characters(blacklist_categories=())  # includes lone surrogates and control characters
TEXT = st.text(ANY_CHAR, max_size=400)

BASE = (
    "<response>\n<analysis>It failed.</analysis>\n<plan>Retry.</plan>\n<commands>\n"
    '<keystrokes duration="0.1">cat > f <<EOF\na < b && c > d\nEOF\n</keystrokes>\n'
    '<keystrokes duration="2">make\n</keystrokes>\n</commands>\n<task_complete>false</task_complete>\n</response>'
)


def check(text: str) -> ParsedReply:
    """Parse and check the invariants every result must satisfy."""
    parsed = parse_reply(text)
    assert isinstance(parsed, ParsedReply)
    assert parsed.rejected == (parsed.error is not None) == (parsed.error_kind is not None)
    assert len(parsed.warnings) == len(parsed.warning_kinds)
    assert all(isinstance(kind, Issue) for kind in parsed.warning_kinds)
    if parsed.rejected:
        assert parsed.commands == () and not parsed.task_complete
    for command in parsed.commands:
        assert command.keystrokes in text
        assert 0 <= command.duration < float("inf") and command.capped_duration <= 60
    salvaged = salvage_truncated(text)
    assert salvaged is None or (text.startswith(salvaged) and not parse_reply(salvaged).rejected)
    return parsed


@settings(max_examples=EXAMPLES["random"], deadline=None)
@given(TEXT)
def test_random_text(text):
    check(text)


@settings(max_examples=EXAMPLES["soup"], deadline=None)
@given(st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(ANY_CHAR, max_size=12)), max_size=40))
def test_unbalanced_tag_soup(pieces):
    check("".join(pieces))


@st.composite
def mutated_replies(draw):
    text = BASE
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(0, len(text)))
        action = draw(st.sampled_from(["insert", "delete", "repeat"]))
        if action == "insert":
            text = text[:at] + draw(st.one_of(st.sampled_from(FRAGMENTS), TEXT)) + text[at:]
        else:
            end = draw(st.integers(at, min(len(text), at + 40)))
            text = text[:at] + (text[at:end] * 2 if action == "repeat" else "") + text[end:]
    return text


@settings(max_examples=EXAMPLES["mutated"], deadline=None)
@given(mutated_replies())
def test_mutated_valid_replies(text):
    check(text)


@settings(max_examples=EXAMPLES["binary"], deadline=None)
@given(st.binary(max_size=600), st.sampled_from(["latin-1", "utf-8"]))
def test_binary_like_input(data, encoding):
    text = data.decode(encoding, errors="surrogateescape") if encoding == "utf-8" else data.decode(encoding)
    check(text)
    check(BASE.replace("make", text))


# Random text, and text built from the reply's own tags: typed tags must stay typed text.
KEYSTROKES = st.one_of(
    st.text(ANY_CHAR, max_size=200),
    st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(ANY_CHAR, max_size=8)), max_size=12).map("".join),
).filter(lambda keys: "</keystrokes>" not in keys)
DURATIONS = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)


@settings(max_examples=EXAMPLES["round_trip"], deadline=None)
@given(st.lists(st.tuples(KEYSTROKES, DURATIONS), min_size=1, max_size=5), st.booleans())
def test_keystrokes_round_trip_byte_exact(commands, complete):
    body = "".join(f'<keystrokes duration="{duration!r}">{keys}</keystrokes>\n' for keys, duration in commands)
    flag = f"<task_complete>{'true' if complete else 'false'}</task_complete>\n"
    text = f"<response>\n<analysis>a</analysis>\n<plan>p</plan>\n<commands>\n{body}</commands>\n{flag}</response>"
    parsed = check(text)
    assert not parsed.rejected
    assert [(c.keystrokes, c.duration) for c in parsed.commands] == commands
    assert parsed.task_complete == complete


@settings(
    max_examples=EXAMPLES["huge"],
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.sampled_from(FRAGMENTS + ["x" * 1000, "<" * 1000]), st.integers(20_000, 100_000), st.sampled_from([BASE, ""]))
def test_huge_repetitive_input(fragment, repeats, around):
    check(fragment * repeats + around)
    check(around.replace("make", fragment * repeats))
