"""Each command-line option says one thing, and a renamed option's former name still works for one release."""

from __future__ import annotations

import pytest

from terminus_env.cli import build_parser
from terminus_env.serving.launcher import build_parser as build_serve_parser

RENAMED = [
    # (the command before its options, the former name, the new one, the value given, the destination, the value read)
    (["eval"], "--output", "--run-file", "r.jsonl", "run_file", "r.jsonl"),
    (["view", "RUN"], "--output", "--page", "p.html", "page", "p.html"),
    (["tasks", "audit"], "--output", "--report", "a.json", "report", "a.json"),
    (["tasks", "audit"], "-o", "--report", "a.json", "report", "a.json"),
    (["tasks", "audit"], "--jobs", "--concurrency", "3", "concurrency", 3),
    (["tasks", "check"], "--jobs", "--concurrency", "3", "concurrency", 3),
]


@pytest.mark.parametrize("command, former, new, given, dest, read", RENAMED)
def test_a_former_option_name_sets_what_the_new_one_sets_and_says_so(capsys, command, former, new, given, dest, read):
    parser = build_parser()
    by_new, by_former = parser.parse_args([*command, new, given]), parser.parse_args([*command, former, given])
    assert capsys.readouterr().err.count(f"{former} is now {new}") == 1  # said once, for the former name only
    assert str(getattr(by_new, dest)) == str(getattr(by_former, dest)) == str(read)
    assert former not in parser.format_help()


@pytest.mark.parametrize("former, new, dest", [
    ("--startup-timeout", "--startup-timeout-s", "startup_timeout_s"),
    ("--stop-timeout", "--stop-timeout-s", "stop_timeout_s"),
])  # fmt: skip
def test_serves_bounds_name_their_unit_and_take_their_former_names(capsys, former, new, dest):
    parser = build_serve_parser()
    base = ["--model", "m"]
    assert getattr(parser.parse_args([*base, new, "7"]), dest) == getattr(parser.parse_args([*base, former, "7"]), dest)
    assert f"{former} is now {new}" in capsys.readouterr().err
    assert getattr(parser.parse_args(base), dest) > 0  # the default still applies when neither is given


def test_concurrency_is_one_word_with_one_short_form_everywhere():
    parser = build_parser()
    for command in (["eval"], ["tasks", "check"], ["tasks", "audit"]):
        assert parser.parse_args([*command, "-j", "5"]).concurrency == 5
        assert parser.parse_args(command).concurrency == 4
