"""Ending a process group whole, with real processes: once `end_group` returns, nothing of the group writes."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from terminus_env.utils import process_group
from terminus_env.utils.process_group import end_group, live_members

# A leader that starts a writer in its own group, says the writer's pid, and exits: the shape of a program stopped
# while a helper it forked still flushes into its folder.
WRITER = """
import os, signal, sys, time
folder = sys.argv[1]
child = os.fork()
if child == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    n = 0
    while True:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"f{n % 50}"), "w") as out:
            out.write("x" * 1000)
        n += 1
print(child, flush=True)
"""


def test_after_end_group_a_folder_its_writer_filled_can_be_removed_and_stays_removed(tmp_path: Path) -> None:
    folder = tmp_path / "written"
    leader = subprocess.Popen([sys.executable, "-c", WRITER, str(folder)], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)  # fmt: skip
    writer = int(leader.stdout.readline())
    leader.wait()  # the leader is gone, the writer is not
    leader.stdout.close()
    try:
        assert live_members(leader.pid) == [writer]
        assert end_group(leader.pid, timeout_s=10) == []
        assert live_members(leader.pid) == []  # the writer is gone: nothing can make the folder again
        shutil.rmtree(folder)
        assert not folder.exists()
    finally:
        end_group(leader.pid, timeout_s=10)


def test_a_zombie_is_not_alive_and_a_group_that_is_gone_ends_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    leader = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{leader.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline, "the child never exited"
        time.sleep(0.01)
    assert live_members(leader.pid) == []  # exited and not yet reaped: it holds no file and runs no code
    looks: list[list[int]] = []

    def counted(pgid: int) -> list[int]:
        looks.append(live_members(pgid))
        return looks[-1]

    monkeypatch.setattr(process_group, "live_members", counted)
    assert end_group(leader.pid, timeout_s=10) == []
    assert looks == [[]]  # at once: one look, no signal, no wait
    assert leader.wait() == 0
