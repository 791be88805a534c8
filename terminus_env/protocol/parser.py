"""Turn a model's Terminus 2 XML reply into terminal commands.

A reply is XML-shaped but not XML: keystrokes hold raw ``<``, ``>`` and ``&``
(heredocs, redirections, ``&&``), so the whole reply can never go through an
XML parser. Structure is located by scanning for the known tags with the rules
Harbor's parser applies (first ``<response>``, first closing tag after each
opening one), so that a turn is rejected, completed and executed here as it
would be under Terminal-Bench. One deliberate difference: keystroke text is
opaque, so a heredoc that holds ``</commands>``, ``</response>`` or
``<task_complete>true</task_complete>`` is typed, not read as structure. lxml
parses what really is XML: the attribute list of each ``<keystrokes>`` tag.

Only two faults reject a turn (no ``<response>``; no ``<commands>`` while the
task is not complete). Everything else is a warning the model gets to read.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from enum import Enum

from lxml import etree

from terminus_env.utils.plain_numbers import read_decimal

MAX_COMMAND_DURATION = 60.0
DEFAULT_DURATION = 1.0

SECTIONS = ("analysis", "plan", "commands")
OPTIONAL_SECTIONS = ("task_complete",)
_KNOWN = frozenset(SECTIONS + OPTIONAL_SECTIONS)
_TAGS = {name: (f"<{name}", f"<{name}>", f"</{name}>") for name in _KNOWN}  # prefix, opening, closing
_ENTITIES = {"&lt;": "<", "&gt;": ">", "&amp;": "&", "&quot;": '"', "&apos;": "'"}
_TAG_NAME = re.compile(r"[A-Za-z_][\w.:-]*")
_COMPLETE = re.compile(r"<task_complete>\s*true\s*</task_complete>")
_KEY_CHORD = re.compile(r"[CM]-\S\Z")  # C-c, M-x: sent as one key, so no Enter is expected
_MAX_UNKNOWN_TAGS = 5
_QUOTE_LIMIT = 40
_ATTR_PARSER = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False)
_LOOSE_DURATION = re.compile(r"""(?<![\w.:-])duration\s*=\s*["'](?P<value>[^"']*)["']""")
_CACHED_ATTRS_MAX_LEN = 256


class Issue(str, Enum):
    """Machine-readable kind of an error or warning (the message is for the model)."""

    NO_RESPONSE = "no_response"
    NO_COMMANDS = "no_commands"
    TEXT_BEFORE_RESPONSE = "text_before_response"
    TEXT_AFTER_RESPONSE = "text_after_response"
    MULTIPLE_RESPONSES = "multiple_responses"
    MULTIPLE_COMMANDS = "multiple_commands"
    MULTIPLE_SECTIONS = "multiple_sections"
    MISSING_SECTION = "missing_section"
    UNKNOWN_TAG = "unknown_tag"
    SECTION_ORDER = "section_order"
    EMPTY_COMMANDS = "empty_commands"
    NO_KEYSTROKES = "no_keystrokes"
    UNCLOSED_KEYSTROKES = "unclosed_keystrokes"
    BAD_ATTRIBUTES = "bad_attributes"
    UNKNOWN_ATTRIBUTE = "unknown_attribute"
    MISSING_DURATION = "missing_duration"
    INVALID_DURATION = "invalid_duration"
    DURATION_CAPPED = "duration_capped"
    MISSING_NEWLINE = "missing_newline"
    ENTITY = "entity"


@dataclass(frozen=True)
class Command:
    """Keys to send, then how long to wait. ``duration`` is as written (1.0 if missing or invalid)."""

    keystrokes: str
    duration: float = DEFAULT_DURATION

    @property
    def capped_duration(self) -> float:
        """The wait actually used: a long sleep is better done as polling, so waits stop at 60 s."""
        return min(self.duration, MAX_COMMAND_DURATION)


@dataclass(frozen=True)
class ParsedReply:
    """One reply, read: what to run, whether the model says it is done, and what to tell it.

    ``warnings`` are shown to the model; ``warning_kinds`` (same order) and ``error_kind`` are for
    metrics and tests.
    """

    commands: tuple[Command, ...] = ()
    task_complete: bool = False
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    analysis: str | None = None
    plan: str | None = None
    error_kind: Issue | None = None
    warning_kinds: tuple[Issue, ...] = ()

    @property
    def rejected(self) -> bool:
        """A rejected turn executes nothing (and ends the episode under strict format)."""
        return self.error is not None


@dataclass
class _Notes:
    """Warnings collected during one parse, kept in the order they were found."""

    messages: list[str] = field(default_factory=list)
    kinds: list[Issue] = field(default_factory=list)

    def add(self, kind: Issue, message: str) -> None:
        self.kinds.append(kind)
        self.messages.append(message)


@dataclass(slots=True)
class _Element:
    """One <keystrokes> element, by absolute positions in the reply."""

    start: int  # the "<" of the opening tag
    attrs: str
    content_start: int
    content_end: int
    end: int  # just past </keystrokes> (or the self-closing tag)


@dataclass(slots=True)
class _Section:
    name: str
    open_at: int  # index of "<" of the first opening tag
    content: tuple[int, int] | None  # content span; None when the tag never closes
    end: int  # index just past the closing (or self-closing / unclosed opening) tag


def parse_reply(text: str) -> ParsedReply:
    """Parse one reply. Never raises for a str: bad input comes back as an error or warnings."""
    if not isinstance(text, str):
        raise TypeError(f"parse_reply takes the reply as str, got {type(text).__name__}: decode it first")
    notes = _Notes()
    start = text.find("<response>")
    if start == -1:
        return _rejected(
            Issue.NO_RESPONSE,
            "No <response> tag found: the whole reply must be wrapped in <response>...</response>.",
            notes,
        )
    body_start = start + len("<response>")
    elements, unclosed = _scan_keystrokes(text, body_start)
    body_end = _response_end(text, body_start, elements, notes)
    body = text[body_start:body_end]
    elements = [e for e in elements if e.end <= body_end]
    masked = _mask(body, body_start, elements)  # the layout, with what is typed blanked out
    sections = {name: _find_section(masked, name) for name in _KNOWN}
    complete = _says_complete(masked)
    analysis, plan = (_text_of(body, sections[name]) for name in ("analysis", "plan"))
    _check_layout(masked, sections, notes)

    commands_section = sections["commands"]
    if commands_section is None or commands_section.content is None:
        if complete:
            return _reply((), True, notes, analysis, plan)
        hint = " (<keystrokes> must sit inside <commands>)" if "<keystrokes" in masked else ""
        return _rejected(
            Issue.NO_COMMANDS,
            f"Missing <commands> section{hint}: give <commands>...</commands>, or mark the task complete.",
            notes,
            analysis,
            plan,
        )
    first, last = commands_section.content
    inside = [e for e in elements if first <= e.start - body_start and e.end - body_start <= last]
    if unclosed is not None and first <= unclosed - body_start < last:
        notes.add(Issue.UNCLOSED_KEYSTROKES, f"Command {len(inside) + 1} has no </keystrokes> and was not executed.")
    commands = _commands(text, inside, notes)
    _check_commands(body[first:last], commands, complete, notes)
    return _reply(commands, complete, notes, analysis, plan)


def salvage_truncated(text: str) -> str | None:
    """Rescue a reply cut off by the token limit, as Harbor's lenient mode does.

    The reply is cut just after the first ``</response>`` that follows ``</commands>``; it
    is kept only if the cut reply parses without error and holds a single response and a
    single ``<commands>`` block. Otherwise None: the turn cannot be rescued.
    """
    commands_end = text.find("</commands>")
    if commands_end == -1:
        return None
    response_end = text.find("</response>", commands_end)
    if response_end == -1:
        return None
    cut = text[: response_end + len("</response>")]
    reply = parse_reply(cut)
    if reply.rejected or {Issue.MULTIPLE_RESPONSES, Issue.MULTIPLE_COMMANDS} & set(reply.warning_kinds):
        return None
    return cut


def _reply(
    commands: tuple[Command, ...], complete: bool, notes: _Notes, analysis: str | None, plan: str | None
) -> ParsedReply:
    return ParsedReply(commands, complete, None, notes.messages, analysis, plan, None, tuple(notes.kinds))


def _rejected(
    kind: Issue, message: str, notes: _Notes, analysis: str | None = None, plan: str | None = None
) -> ParsedReply:
    return ParsedReply((), False, message, notes.messages, analysis, plan, kind, tuple(notes.kinds))


def _scan_keystrokes(text: str, body_start: int) -> tuple[list[_Element], int | None]:
    """The <keystrokes> elements of the first <commands> block, and where an unclosed one starts.

    Keystroke text is opaque: a heredoc holding </commands> or </response> stays part of its
    command. The block ends at the first </commands> outside keystrokes.
    """
    elements: list[_Element] = []
    opening = text.find("<commands>", body_start)
    if opening == -1:
        return elements, None
    closing = text.find("</commands>", opening)
    at = text.find("<keystrokes", opening)
    while at != -1 and (closing == -1 or at < closing):
        tag_end = text.find(">", at)
        if tag_end == -1:
            return elements, at
        attrs = text[at + len("<keystrokes") : tag_end]
        if attrs.endswith("/") and _read_attributes(attrs[:-1]).well_formed:  # <keystrokes .../>: a wait
            element = _Element(at, attrs[:-1], tag_end + 1, tag_end + 1, tag_end + 1)
        else:
            close_at = text.find("</keystrokes>", tag_end + 1)
            if close_at == -1:
                return elements, at
            element = _Element(at, attrs, tag_end + 1, close_at, close_at + len("</keystrokes>"))
        elements.append(element)
        if closing != -1 and closing < element.end:  # that </commands> was typed text
            closing = text.find("</commands>", element.end)
        at = text.find("<keystrokes", element.end)
    return elements, None


def _response_end(text: str, body_start: int, elements: list[_Element], notes: _Notes) -> int:
    """Where the response body ends: the first </response> outside keystrokes, else the end."""
    end = text.find("</response>", body_start)
    for element in elements:
        if end == -1 or end < element.content_start:
            break
        if end < element.content_end:
            end = text.find("</response>", element.content_end)
    if text[: body_start - len("<response>")].strip():
        notes.add(Issue.TEXT_BEFORE_RESPONSE, "Extra text before <response> was ignored; reply with the XML only.")
    if end == -1:
        return len(text)
    if text[end + len("</response>") :].strip():
        notes.add(Issue.TEXT_AFTER_RESPONSE, "Extra text after </response> was ignored; reply with the XML only.")
    responses = text.count("<response>", end) + 1
    if responses > 1:
        notes.add(
            Issue.MULTIPLE_RESPONSES,
            f"Send one <response> block at a time: you sent {responses} and only the first was executed.",
        )
    return end


def _mask(body: str, offset: int, elements: list[_Element]) -> str:
    """The body with keystroke text replaced by NULs, so tags typed into a heredoc are not structure."""
    if not elements:
        return body
    pieces: list[str] = []
    at = 0
    for element in elements:
        first, last = element.content_start - offset, element.content_end - offset
        pieces += (body[at:first], "\0" * (last - first))
        at = last
    pieces.append(body[at:])
    return "".join(pieces)


def _find_section(body: str, name: str) -> _Section | None:
    """First <name>...</name>, else the first self-closing <name/>; None when neither is there."""
    prefix, opening, closing = _TAGS[name]
    at = body.find(opening)
    if at != -1:
        close_at = body.find(closing, at + len(opening))
        if close_at != -1:
            return _Section(name, at, (at + len(opening), close_at), close_at + len(closing))
    empty_at, empty_end = _self_closing(body, prefix)
    if empty_at != -1:
        return _Section(name, empty_at, (empty_end, empty_end), empty_end)
    if at != -1:
        return _Section(name, at, None, at + len(opening))
    return None


def _self_closing(body: str, prefix: str) -> tuple[int, int]:
    """Position and end of the first ``<name/>`` (white space allowed before the slash)."""
    at = body.find(prefix)
    while at != -1:
        rest = at + len(prefix)
        slash = rest
        while slash < len(body) and body[slash].isspace():
            slash += 1
        if body.startswith("/>", slash):
            return at, slash + 2
        at = body.find(prefix, rest)
    return -1, -1


def _text_of(body: str, section: _Section | None) -> str | None:
    if section is None or section.content is None:
        return None
    first, last = section.content
    return body[first:last].strip()


def _says_complete(body: str) -> bool:
    """True when any <task_complete> holds just ``true`` (any case, white space around)."""
    return _COMPLETE.search(body.lower()) is not None


def _check_layout(body: str, sections: dict[str, _Section | None], notes: _Notes) -> None:
    """Warn about missing, repeated, unknown and misordered top-level sections."""
    for name in ("analysis", "plan"):  # a missing <commands> is an error, or fine once complete
        section = sections[name]
        if section is None or section.content is None:
            notes.add(Issue.MISSING_SECTION, f"Missing <{name}> section.")
    for name in SECTIONS + OPTIONAL_SECTIONS:
        section = sections[name]
        if section is not None and _opens_again(body, _TAGS[name][0], section.end):
            if name == "commands":
                notes.add(
                    Issue.MULTIPLE_COMMANDS,
                    "Send one <commands> block per response: only the first one was executed.",
                )
            else:
                notes.add(Issue.MULTIPLE_SECTIONS, f"Several <{name}> sections found; only the first was read.")
    for tag in _unknown_top_level_tags(body):
        notes.add(
            Issue.UNKNOWN_TAG, f"Unknown tag <{_clip(tag)}> ignored: use only analysis, plan, commands, task_complete."
        )
    present = [section for section in map(sections.get, SECTIONS) if section is not None]
    starts = [section.open_at for section in present]
    if starts != sorted(starts):
        found = sorted(present, key=lambda section: section.open_at)
        notes.add(
            Issue.SECTION_ORDER,
            "Sections are out of order: found "
            + " -> ".join(s.name for s in found)
            + ", expected "
            + " -> ".join(s.name for s in present)
            + ".",
        )


def _opens_again(body: str, prefix: str, after: int) -> bool:
    """Whether another <name> or <name .../> (``prefix`` is "<name") opens after the first section ends."""
    at = body.find(prefix, after)
    while at != -1:
        follow = body[at + len(prefix) : at + len(prefix) + 1]
        if follow in (">", "/") or follow.isspace():
            return True
        at = body.find(prefix, at + 1)
    return False


def _unknown_top_level_tags(body: str) -> list[str]:
    """Names of tags found between the sections (a few at most), each skipped to its closing tag.

    Where each name's closing tag lies is remembered, so the scan stays linear in the body.
    """
    unknown: list[str] = []
    closings: dict[str, int] = {}
    at = body.find("<")
    while at != -1 and len(unknown) < _MAX_UNKNOWN_TAGS:
        resume = at + 1
        name_match = _TAG_NAME.match(body, at + 1)
        if name_match is not None:
            name = name_match.group()
            tag_end = body.find(">", name_match.end())
            if tag_end == -1:
                break
            resume = tag_end + 1
            if body[tag_end - 1] != "/":
                resume = _past_closing(body, name, resume, closings)
            if name not in _KNOWN and name not in unknown:
                unknown.append(name)
        at = body.find("<", resume)
    return unknown


def _past_closing(body: str, name: str, start: int, closings: dict[str, int]) -> int:
    """Index just past the first </name> at or after start, or start itself if none follows."""
    known = closings.get(name)
    if known is None or (known != -1 and known < start):
        known = closings[name] = body.find(f"</{name}>", start)
    return start if known == -1 else known + len(name) + 3


def _commands(text: str, elements: list[_Element], notes: _Notes) -> tuple[Command, ...]:
    """One command per element, keystrokes exactly as written."""
    commands = []
    for number, element in enumerate(elements, start=1):
        reading = _read_attributes(element.attrs)
        for kind, message in reading.issues:
            notes.add(kind, f"Command {number}: {message}")
        commands.append(Command(text[element.content_start : element.content_end], reading.seconds))
    return tuple(commands)


def _check_commands(content: str, commands: tuple[Command, ...], complete: bool, notes: _Notes) -> None:
    """Warnings about the block as a whole: empty, a silent no-op, run-on lines, escaped text."""
    if not content.strip():
        if not complete:
            notes.add(
                Issue.EMPTY_COMMANDS,
                "<commands> is empty, so nothing ran. To wait for a running command, send empty keystrokes "
                'with a duration, e.g. <keystrokes duration="10"></keystrokes>.',
            )
        return
    if not commands and "<keystrokes" not in content:  # an unclosed one was reported already
        notes.add(
            Issue.NO_KEYSTROKES,
            "<commands> holds text but no <keystrokes> element, so nothing ran: "
            'put each command in <keystrokes duration="...">...</keystrokes>.',
        )
        return
    for number, command in enumerate(commands[:-1], start=1):
        if command.keystrokes and not command.keystrokes.endswith("\n") and not _KEY_CHORD.match(command.keystrokes):
            notes.add(
                Issue.MISSING_NEWLINE,
                f"Command {number} does not end with a newline, so it runs together with command {number + 1} "
                "on one line.",
            )
    keys = "".join(command.keystrokes for command in commands)
    typed = [entity for entity in _ENTITIES if entity in keys] if "&" in keys else []
    if typed:
        listing = ", ".join(f"{entity} (not {_ENTITIES[entity]})" for entity in typed)
        notes.add(
            Issue.ENTITY,
            f"Keystrokes are typed verbatim, so {listing} reached the terminal as written. "
            "Write <, >, &, quotes directly; never XML-escape keystrokes.",
        )


@dataclass(frozen=True)
class _Reading:
    """What a <keystrokes> attribute list says, and what to tell the model about it."""

    seconds: float
    well_formed: bool
    issues: tuple[tuple[Issue, str], ...]  # messages lack their "Command N: " prefix


def _read_attributes(attrs: str) -> _Reading:
    """Read an attribute list. Opening tags repeat almost verbatim, so short ones are memoised."""
    if len(attrs) <= _CACHED_ATTRS_MAX_LEN:
        return _read_attributes_cached(attrs)
    return _read_attributes_uncached(attrs)


def _read_attributes_uncached(attrs: str) -> _Reading:
    pairs, syntax_error = _xml_attributes(attrs)
    issues: list[tuple[Issue, str]] = []
    if syntax_error is not None:
        issues.append((Issue.BAD_ATTRIBUTES, f'write attributes as name="value" ({syntax_error}).'))
    values: dict[str, str] = {}
    for name, value in pairs:  # the first of repeated attributes wins
        values.setdefault(name, value)
    issues += [
        (Issue.UNKNOWN_ATTRIBUTE, f"unknown attribute '{_clip(name)}'; only duration is read.")
        for name in values
        if name != "duration"
    ]
    seconds = _seconds(values.get("duration"), issues)
    return _Reading(seconds, syntax_error is None, tuple(issues))


_read_attributes_cached = functools.lru_cache(maxsize=512)(_read_attributes_uncached)


def _seconds(raw: str | None, issues: list[tuple[Issue, str]]) -> float:
    """The wait a duration value asks for; 1.0 (with an issue) when it is missing or unusable."""
    if raw is None:
        issues.append((Issue.MISSING_DURATION, 'no duration="seconds" attribute; using 1.0 s.'))
        return DEFAULT_DURATION
    seconds = read_decimal(raw)
    seconds = math.nan if seconds is None else seconds
    if not math.isfinite(seconds) or seconds < 0:
        problem = f"duration {_clip(raw)!r} is not a decimal number of seconds, like 0.5 or 10; using 1.0 s."
        issues.append((Issue.INVALID_DURATION, problem))
        return DEFAULT_DURATION
    if seconds > MAX_COMMAND_DURATION:
        issues.append(
            (Issue.DURATION_CAPPED, f"waits stop at {MAX_COMMAND_DURATION:g} s; check again later to wait longer.")
        )
    return seconds


def _xml_attributes(attrs: str) -> tuple[tuple[tuple[str, str], ...], str | None]:
    """Attributes of an opening tag, read by lxml; the error text if the list is not valid XML."""
    try:
        element = etree.fromstring(f"<keystrokes{attrs}/>", _ATTR_PARSER)
        if element.tag == "keystrokes":
            return tuple(element.attrib.items()), None
        reason = f"<{_clip(element.tag)}> is not <keystrokes>"
    except etree.XMLSyntaxError as exc:  # its own message: the shared parser's error_log keeps every earlier error
        reason = exc.msg or str(exc)
    except ValueError as exc:  # lxml refuses some code points outright
        reason = str(exc)
    # Not XML, but a quoted duration="..." among the debris still counts, as it does for Harbor.
    loose = _LOOSE_DURATION.search(attrs)
    return ((("duration", loose["value"]),) if loose else ()), f"lxml: {_clip(reason)}"


def _clip(text: str) -> str:
    """Quote at most a short prefix of model-written text back to the model."""
    return text if len(text) <= _QUOTE_LIMIT else text[:_QUOTE_LIMIT] + "..."
