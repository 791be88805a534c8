"""Sandbox pieces that need no Docker: key parsing, output capping, specs, image tags."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from terminus_env.sandbox.images import _split_reference, context_hash, slug
from terminus_env.sandbox.services import Readiness, readiness
from terminus_env.sandbox.spec import DEFAULT_CPUS, DEFAULT_MEMORY_MB, SandboxSpec
from terminus_env.sandbox.terminal import CHUNK_BYTES, key_arguments
from terminus_env.utils.output_cap import cap_text
from terminus_env.utils.sidecars import Condition


@pytest.mark.parametrize("name", ["C-c", "C-d", "Enter", "Escape", "Up", "Tab", "M-x", "C-M-a", "F12", "BSpace"])
def test_exact_key_names_are_sent_as_keys(name: str) -> None:
    assert key_arguments(name) == [[name]]


@pytest.mark.parametrize("text", ["ls\n", "C-c\n", "enter", "-n", "Up ", "x", "C-", ""])
def test_other_text_is_literal(text: str) -> None:
    calls = key_arguments(text)
    assert all(call[:2] == ["-l", "--"] for call in calls)
    assert "".join(call[2] for call in calls) == text


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
    assert spec.effective_life_needed_s == spec.lifetime_s / 2
    assert SandboxSpec("img", lifetime_s=60, life_needed_s=60).effective_life_needed_s == 60
    with pytest.raises(TypeError):
        spec.env["B"] = "2"  # type: ignore[index]
    bad_specs = (
        {"image": ""},
        {"image": "i", "cpus": 0},
        {"image": "i", "cpus": 1e300},
        {"image": "i", "cpus": float("nan")},
        {"image": "i", "memory_mb": 1},
        {"image": "i", "memory_mb": 10**12},
        {"image": "i", "storage_mb": 0},
        {"image": "i", "lifetime_s": 0},
        {"image": "i", "lifetime_s": 1e308},
        {"image": "i", "lifetime_s": 60, "life_needed_s": 61},
        {"image": "i", "life_needed_s": -1},
        {"image": "i", "pids_limit": 0},
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


# --- sidecars: when a dependency holds, and image references ---------------------------------------

RUNNING = {"Status": "running", "Running": True, "ExitCode": 0}
EXITED_0 = {"Status": "exited", "Running": False, "ExitCode": 0}
EXITED_3 = {"Status": "exited", "Running": False, "ExitCode": 3}
CREATED = {"Status": "created", "Running": False, "ExitCode": 0}


def health(status: str, output: str = "", code: int = 0) -> dict:
    return {**RUNNING, "Health": {"Status": status, "Log": [{"ExitCode": code, "Output": output}]}}


@pytest.mark.parametrize(
    ("condition", "state", "verdict", "why"),
    [
        (Condition.STARTED, CREATED, Readiness.WAIT, ""),
        (Condition.STARTED, RUNNING, Readiness.READY, ""),
        (Condition.STARTED, EXITED_0, Readiness.READY, ""),
        (Condition.STARTED, EXITED_3, Readiness.FAILED, "exited with code 3"),
        (Condition.HEALTHY, RUNNING, Readiness.FAILED, "has no health check"),
        (Condition.HEALTHY, health("starting"), Readiness.WAIT, ""),
        (Condition.HEALTHY, health("healthy"), Readiness.READY, ""),
        (Condition.HEALTHY, health("unhealthy", "refused\n on 5432", 2), Readiness.FAILED,
         "is unhealthy (its last check exited 2: refused on 5432)"),
        (Condition.HEALTHY, {**EXITED_0, "Health": {"Status": "starting"}}, Readiness.FAILED, "exited with code 0"),
        (Condition.COMPLETED, RUNNING, Readiness.WAIT, ""),
        (Condition.COMPLETED, EXITED_0, Readiness.READY, ""),
        (Condition.COMPLETED, EXITED_3, Readiness.FAILED, "exited with code 3"),
    ],
)
def test_readiness_of_a_dependency(condition: Condition, state: dict, verdict: Readiness, why: str) -> None:
    found, reason = readiness(condition, state)
    assert found is verdict and why in reason and (why or not reason)


@pytest.mark.parametrize(
    ("reference", "expected"),
    [
        ("redis", ("redis", "latest")),
        ("redis:7.2", ("redis", "7.2")),
        ("registry.local:5000/team/db", ("registry.local:5000/team/db", "latest")),
        ("registry.local:5000/team/db:1", ("registry.local:5000/team/db", "1")),
        ("db@sha256:abc", ("db", "sha256:abc")),
    ],
)
def test_image_references_split_into_repository_and_tag(reference: str, expected: tuple[str, str]) -> None:
    assert _split_reference(reference) == expected
