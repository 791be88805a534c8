"""The layer's changes as the grade reads them: the walk of the writable folder (any depth, any name length, links
never followed), whether the image had a path (whiteouts and opaque folders of its layers), and a layer that cannot be
inspected blamed on the agent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from terminus_env.sandbox.errors import BrokenByAgent, SandboxError
from terminus_env.sandbox.layer_diff import LayerDiff, LayerFolders, in_image, layer_diff, walk_upper
from terminus_env.sandbox.tamper import Change


def _whiteout(path: Path) -> None:
    os.mknod(path, 0o600 | 0o020000, os.makedev(0, 0))  # a character device 0/0, as overlay writes a deletion


def test_the_walk_lists_every_entry_to_any_name_length_without_following_links(tmp_path: Path) -> None:
    upper = tmp_path / "upper"
    (upper / "usr/lib/python3/__pycache__").mkdir(parents=True)
    (upper / "usr/lib/python3/__pycache__/os.cpython-311.pyc").write_bytes(b"x")
    (upper / "app").mkdir()
    (upper / "app/pytest").symlink_to("/usr/lib/python3.11")  # a link to a folder is listed, not entered
    (upper / "tmp").mkdir()
    fd = os.open(upper / "tmp", os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(40):  # 40 levels of 250-character names: 10,000 characters, past PATH_MAX
        os.mkdir("d" * 250, dir_fd=fd)
        child = os.open("d" * 250, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.close(fd)
    listed = list(walk_upper(str(upper)))
    paths = [path for path, _ in listed]
    assert [path for path, link in listed if link] == ["/app/pytest"]
    assert "/usr/lib/python3/__pycache__/os.cpython-311.pyc" in paths
    assert not any(path.startswith("/app/pytest/") for path in paths)
    deepest = max(paths, key=len)
    assert deepest.count("/") == 41 and len(deepest) > 10_000


def test_a_layer_past_the_entry_budget_is_the_agents_doing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("terminus_env.sandbox.layer_diff.MAX_ENTRIES", 50)
    for index in range(60):
        (tmp_path / f"f{index}").write_bytes(b"")
    with pytest.raises(BrokenByAgent, match="more than 50 entries"):
        list(walk_upper(str(tmp_path)))


def test_whether_the_image_had_a_path_follows_its_layers_whiteouts_and_opaque_folders(tmp_path: Path) -> None:
    top, bottom = tmp_path / "top", tmp_path / "bottom"
    for folder in ("usr/bin", "etc/app", "opt/pkg"):
        (bottom / folder).mkdir(parents=True)
    (bottom / "usr/bin/python3").write_bytes(b"\x7fELF")
    (bottom / "usr/bin/gone").write_bytes(b"")
    (bottom / "etc/app/old.conf").write_text("x")
    (bottom / "opt/pkg/mod.py").write_text("")
    (top / "usr/bin").mkdir(parents=True)
    _whiteout(top / "usr/bin/gone")  # deleted by a later layer of the image
    (top / "opt/pkg").mkdir(parents=True)
    os.setxattr(top / "opt/pkg", "trusted.overlay.opaque", b"y")  # the later layer replaced the whole folder
    lowers = (str(top), str(bottom))
    assert in_image(lowers, "/usr/bin/python3")
    assert not in_image(lowers, "/usr/bin/gone")
    assert not in_image(lowers, "/opt/pkg/mod.py")
    assert in_image(lowers, "/etc/app/old.conf") and not in_image(lowers, "/etc/app/new.conf")

    upper = tmp_path / "upper"
    (upper / "usr/bin").mkdir(parents=True)
    (upper / "usr/bin/python3").write_bytes(b"#!/bin/sh\nexit 0\n")
    (upper / "usr/bin/jq").write_bytes(b"\x7fELF")
    _whiteout(upper / "usr/bin/gone")
    diff = LayerDiff(tuple(path for path, _ in walk_upper(str(upper))), (), LayerFolders(str(upper), lowers))
    assert diff.kinds_of(["/usr/bin/python3", "/usr/bin/jq", "/usr/bin/gone", "/usr/bin/absent"]) == {
        "/usr/bin/python3": Change.MODIFIED, "/usr/bin/jq": Change.ADDED, "/usr/bin/gone": Change.DELETED,
    }  # fmt: skip


class _Api:
    def __init__(self, diff_error: Exception | None, inspect_error: Exception | None) -> None:
        self.diff_error, self.inspect_error = diff_error, inspect_error

    def diff(self, container_id: str) -> list[dict]:
        if self.diff_error is not None:
            raise self.diff_error
        return [{"Path": "/usr/bin/python3", "Kind": 0}, {"Path": "/app/x", "Kind": 1}]

    def inspect_container(self, container_id: str) -> dict:
        if self.inspect_error is not None:
            raise self.inspect_error
        return {}


class _Client:
    def __init__(self, api: _Api) -> None:
        self.api = api


def test_where_only_docker_can_tell_its_diff_answers_and_its_failure_is_blamed_by_what_else_answers() -> None:
    from docker.errors import APIError

    diff = layer_diff(_Client(_Api(None, None)), "c" * 64, None)  # type: ignore[arg-type]
    assert diff.kinds_of(["/usr/bin/python3", "/app/x", "/nope"]) == {"/usr/bin/python3": Change.MODIFIED,
                                                                        "/app/x": Change.ADDED}  # fmt: skip
    too_long = APIError("500 Server Error: file name too long")
    with pytest.raises(BrokenByAgent, match="file name too long"):  # Docker answers the rest: the layer is at fault
        layer_diff(_Client(_Api(too_long, None)), "c" * 64, None)  # type: ignore[arg-type]
    with pytest.raises(SandboxError) as raised:  # Docker answers nothing: the infrastructure's
        layer_diff(_Client(_Api(too_long, APIError("connection refused"))), "c" * 64, None)  # type: ignore[arg-type]
    assert not isinstance(raised.value, BrokenByAgent)
