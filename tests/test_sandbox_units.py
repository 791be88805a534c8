"""Sandbox pieces that need no Docker: key parsing, output capping, specs, image tags."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from terminus_env.sandbox import agent
from terminus_env.sandbox.images import context_hash, slug
from terminus_env.sandbox.spec import DEFAULT_CPUS, DEFAULT_MEMORY_MB, SandboxSpec
from terminus_env.sandbox.terminal import CHUNK_BYTES, key_arguments
from terminus_env.sandbox.text import cap_text


@pytest.mark.parametrize("name", ["C-c", "C-d", "Enter", "Escape", "Up", "Tab", "M-x", "C-M-a", "F12", "BSpace"])
def test_exact_key_names_are_sent_as_keys(name: str) -> None:
    assert key_arguments(name) == [[name]]


@pytest.mark.parametrize("text", ["ls\n", "C-c\n", "enter", "-n", "Up ", "x", "C-", ""])
def test_other_text_is_literal(text: str) -> None:
    calls = key_arguments(text)
    assert all(call[:2] == ["-l", "--"] for call in calls)
    assert "".join(call[2] for call in calls) == text


def test_tmux_argv_fallback_escapes_a_trailing_semicolon() -> None:
    seen = []
    agent.run_tmux = lambda argv, user: seen.append(argv) or (0, "", "")  # type: ignore[assignment]
    try:
        commands = [["send-keys", "-l", "--", "a;"], ["send-keys", "-l", "--", "{} \\;"]]
        agent.Tmux.run_process({"tmux": ["tmux"]}, commands)
    finally:
        importlib.reload(agent)
    assert seen == [["tmux", "send-keys", "-l", "--", "a\\;", ";", "send-keys", "-l", "--", "{} \\\\;"]]


def test_control_mode_quoting() -> None:
    assert agent.control_quote('a "b" $HOME \\ ;\n\t\x1b') == '"a \\"b\\" \\$HOME \\\\ ;\\n\\011\\033"'


def test_nul_becomes_its_key_and_surrogates_become_replacement_characters() -> None:
    assert key_arguments("a\0b") == [["-l", "--", "a"], ["C-@"], ["-l", "--", "b"]]
    assert key_arguments("x\udcff") == [["-l", "--", "x\ufffd"]]


@given(st.text(min_size=1, max_size=3000))
def test_chunks_rebuild_the_text_and_stay_small(text: str) -> None:
    calls = [call for call in key_arguments(text * 10) if call[0] == "-l"]
    for call in calls:
        assert len(call[2].encode("utf-8", "surrogatepass")) <= CHUNK_BYTES + 1
    rebuilt = "".join(call[2] for call in calls)
    assert rebuilt == "".join(ch if not 0xD800 <= ord(ch) <= 0xDFFF else "\ufffd" for ch in text * 10).replace("\0", "")


def test_cap_text_keeps_both_ends_and_names_the_cut() -> None:
    assert cap_text("short") == ("short", 0)
    text = "a" * 6000 + "b" * 6000
    capped, omitted = cap_text(text)
    assert omitted == 2000
    assert capped.startswith("a" * 5000) and capped.endswith("b" * 5000)
    assert "2000 interior bytes omitted" in capped


def test_cap_text_never_splits_a_character() -> None:
    capped, omitted = cap_text("é" * 8000)
    assert omitted == 6000 and "\ufffd" not in capped


def test_spec_defaults_hashing_and_validation() -> None:
    spec = SandboxSpec("img", env={"A": "1"})
    assert spec.effective_cpus == DEFAULT_CPUS and spec.effective_memory_mb == DEFAULT_MEMORY_MB
    assert spec == SandboxSpec("img", env={"A": "1"}) and hash(spec) == hash(SandboxSpec("img", env={"A": "1"}))
    assert spec != SandboxSpec("img", env={"A": "2"})
    with pytest.raises(TypeError):
        spec.env["B"] = "2"  # type: ignore[index]
    bad_specs = (
        {"image": ""},
        {"image": "i", "cpus": 0},
        {"image": "i", "memory_mb": 1},
        {"image": "i", "lifetime_s": 0},
    )
    for bad in bad_specs:
        with pytest.raises(ValueError):
            SandboxSpec(**bad)  # type: ignore[arg-type]


def test_context_hash_follows_content_and_modes(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM x\n")
    first = context_hash(tmp_path)
    assert context_hash(tmp_path) == first and len(first) == 16
    (tmp_path / "Dockerfile").chmod(0o600)
    second = context_hash(tmp_path)
    (tmp_path / "Dockerfile").write_text("FROM y\n")
    assert len({first, second, context_hash(tmp_path)}) == 3


def test_context_hash_ignores_bytecode_caches(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM x\n")
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "tool.py").write_text("print(1)\n")
    clean = context_hash(tmp_path)
    for cache in (tmp_path / "__pycache__", tmp_path / "app" / "__pycache__"):  # what pip leaves in installed tasks
        cache.mkdir()
        (cache / "tool.cpython-311.pyc").write_bytes(b"\x00" * 16)
    assert context_hash(tmp_path) == clean
    (tmp_path / "app" / "tool.py").write_text("print(2)\n")
    assert context_hash(tmp_path) != clean


def test_context_hash_follows_the_parent_image(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM x\n")
    assert context_hash(tmp_path, ["sha256:aa"]) != context_hash(tmp_path, ["sha256:bb"])
    assert context_hash(tmp_path, ["sha256:aa", "sha256:bb"]) == context_hash(tmp_path, ["sha256:bb", "sha256:aa"])


def test_slug_is_a_valid_repository_name() -> None:
    assert slug("My Task: v2!") == "my-task-v2"
    assert slug("***") == "task"
