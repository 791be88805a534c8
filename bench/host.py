"""What a sandbox host's parts cost, read from /proc and the cgroups: the benchmarks of one host share these.

Reading files costs the engine nothing, unlike ``docker stats``, which would add to the very CPU being measured.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")
_CGROUP_CPU = (  # where a container's CPU time is, by cgroup version and driver (cgroupfs, then systemd)
    "/sys/fs/cgroup/cpuacct/docker/{id}/cpuacct.usage",
    "/sys/fs/cgroup/cpu,cpuacct/docker/{id}/cpuacct.usage",
    "/sys/fs/cgroup/docker/{id}/cpu.stat",
    "/sys/fs/cgroup/system.slice/docker-{id}.scope/cpu.stat",
)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def host_memory_gib() -> tuple[float, float]:
    """(memory in use, memory available) on this machine, GiB, as /proc/meminfo counts them."""
    info = {line.split(":")[0]: int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()}
    return (info["MemTotal"] - info["MemAvailable"]) / 2**20, info["MemAvailable"] / 2**20


def _cmdline(pid: str) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _parent(pid: str) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return 0


def shim_pids(container_ids: list[str]) -> list[int]:
    """The containerd shims of these containers (one per container on Docker 20.10)."""
    wanted = set(container_ids)
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            argv = _cmdline(entry.name)
            if argv and "containerd-shim" in argv[0] and wanted.intersection(argv):
                found.append(int(entry.name))
    return found


@dataclass(frozen=True)
class Engine:
    """The processes of the Docker engine at ``DOCKER_HOST`` (the default socket when unset)."""

    dockerd: int
    containerd: int | None

    @classmethod
    def find(cls) -> Engine:
        socket = os.environ.get("DOCKER_HOST", "").removeprefix("unix://")
        daemons, children = [], {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            argv = _cmdline(entry.name)
            if argv and argv[0].endswith("dockerd"):
                daemons.append((int(entry.name), argv))
            elif argv and argv[0].endswith("containerd"):
                children[_parent(entry.name)] = int(entry.name)  # keyed by the dockerd that started it
        named = [pid for pid, argv in daemons if socket and any(socket in arg for arg in argv)]
        plain = [pid for pid, argv in daemons if not any(arg.startswith(("-H", "--host")) for arg in argv)]
        if not (named or plain):
            raise RuntimeError(f"no dockerd process serves {socket or 'the default socket'} on this machine")
        dockerd = (named or plain)[0]
        return cls(dockerd, children.get(dockerd))


def container_cpu_s(container_ids: list[str]) -> float | None:
    """CPU seconds the containers used so far, from their cgroups; None where the cgroups are not found."""
    total = 0.0
    for cid in container_ids:
        for pattern in _CGROUP_CPU:
            path = Path(pattern.format(id=cid))
            if path.exists():
                text = path.read_text()
                total += int(text) / 1e9 if path.name == "cpuacct.usage" else int(text.split()[1]) / 1e6
                break
        else:
            return None
    return total
