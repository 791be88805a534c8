"""Which process owns a sandbox container, written into its labels, and whether that owner still lives.

A pid alone is reused, so the owner is the pid plus the process's start time (in clock ticks since
boot, from /proc/<pid>/stat), on a host named by hostname and pid namespace.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass

LABEL = "terminus-env.sandbox"
PID_LABEL = "terminus-env.owner-pid"
START_LABEL = "terminus-env.owner-start"
HOST_LABEL = "terminus-env.owner-host"
RUN_LABEL = "terminus-env.run"


@dataclass(frozen=True)
class Owner:
    pid: int
    start: str
    host: str

    @classmethod
    def current(cls) -> Owner:
        return cls(os.getpid(), process_start(os.getpid()) or "", host_id())

    def labels(self, run: str) -> dict[str, str]:
        return {LABEL: "1", PID_LABEL: str(self.pid), START_LABEL: self.start, HOST_LABEL: self.host, RUN_LABEL: run}

    @classmethod
    def from_labels(cls, labels: dict[str, str]) -> Owner | None:
        try:
            return cls(int(labels[PID_LABEL]), labels[START_LABEL], labels[HOST_LABEL])
        except (KeyError, ValueError):
            return None

    def alive(self) -> bool:
        """True unless this host can tell the owner is gone (another host's owners count as alive)."""
        if self.host != host_id():
            return True
        return process_start(self.pid) == self.start


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def process_start(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def host_id() -> str:
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = "pid:[?]"
    return f"{socket.gethostname()}/{namespace}"
