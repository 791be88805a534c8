"""Ending a process group whole, and knowing when it is gone.

A program stopped by its pid leaves the helpers it forked running for a moment: vLLM's engine processes, a
browser's renderer and storage processes, debootstrap's dpkg. Whoever then removes the folder those helpers write
into races them (``rmtree`` fails on a folder a helper refilled, or a helper writes into a tree half removed). So
the programs that fork are started in a session of their own, and stopping one means: every process of its group
killed, and none of them left alive, before anything they wrote is touched.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

POLL_S = 0.01
GONE_STATES = (b"Z", b"X")
"""A zombie (or a process being reaped) has released its files and can write nothing more."""


def live_members(pgid: int) -> list[int]:
    """The pids of the group's processes that can still act."""
    try:
        entries = os.listdir("/proc")
    except OSError:  # no procfs: ask the kernel whether the group has any process at all
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [pgid]
    alive = []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()  # after the command, which may hold anything
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[2]) == pgid and fields[0] not in GONE_STATES:
            alive.append(int(name))
    return alive


def end_group(pgid: int, timeout_s: float) -> list[int]:
    """SIGKILL every process of group ``pgid`` until none is left alive; the pids still alive after ``timeout_s``
    (a process in uninterruptible I/O dies only when the I/O ends), empty once the group is gone.

    The caller still reaps its own child, the group's leader, with ``wait``."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = live_members(pgid)
        if not alive:
            return []
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        if time.monotonic() >= deadline:
            return alive
        time.sleep(POLL_S)
