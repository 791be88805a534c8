import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = "/usr/local/bin/rotate-logs"


def rotate(*args):
    return subprocess.run([SCRIPT, *map(str, args)], capture_output=True, text=True, timeout=30)


def snapshot(folder):
    return {p.name: p.read_text() for p in sorted(folder.iterdir()) if p.is_file()}


def write(folder, files):
    for name, text in files.items():
        (folder / name).write_text(text)


def test_script_is_executable():
    assert os.access(SCRIPT, os.X_OK)


def test_first_rotation(tmp_path):
    write(tmp_path, {"app.log": "a0", "my app.log": "s0", "notes.txt": "n", "app.log.bak": "b"})
    assert rotate(tmp_path).returncode == 0
    assert snapshot(tmp_path) == {
        "app.log": "", "app.log.1": "a0", "app.log.bak": "b",
        "my app.log": "", "my app.log.1": "s0", "notes.txt": "n",
    }


def test_shift_and_drop_beyond_default_keep(tmp_path):
    write(tmp_path, {"app.log": "a0", "app.log.1": "a1", "app.log.2": "a2", "app.log.3": "a3"})
    assert rotate(tmp_path).returncode == 0
    assert snapshot(tmp_path) == {"app.log": "", "app.log.1": "a0", "app.log.2": "a1", "app.log.3": "a2"}


def test_custom_keep(tmp_path):
    write(tmp_path, {"x.log": "x0", "x.log.1": "x1", "x.log.2": "x2"})
    assert rotate(tmp_path, 5).returncode == 0
    assert snapshot(tmp_path) == {"x.log": "", "x.log.1": "x0", "x.log.2": "x1", "x.log.3": "x2"}
    assert rotate(tmp_path, 1).returncode == 0
    assert snapshot(tmp_path) == {"x.log": "", "x.log.1": ""}


def test_subfolders_untouched(tmp_path):
    (tmp_path / "old").mkdir()
    write(tmp_path / "old", {"deep.log": "d"})
    write(tmp_path, {"top.log": "t"})
    assert rotate(tmp_path).returncode == 0
    assert snapshot(tmp_path / "old") == {"deep.log": "d"}


@pytest.mark.parametrize("args", [(), ("/nonexistent-folder",), ("{dir}", "0"), ("{dir}", "abc"), ("{dir}", "-1")])
def test_usage_errors(tmp_path, args):
    write(tmp_path, {"app.log": "a0"})
    run = rotate(*(a.format(dir=tmp_path) for a in args))
    assert run.returncode == 2
    assert run.stderr.strip()
    assert snapshot(tmp_path) == {"app.log": "a0"}
