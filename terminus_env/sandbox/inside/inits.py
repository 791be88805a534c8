"""Part 1, on the verifier's and the agent's sides: PID 1 of each side's namespaces. The verifier's init starts the
agent's side, takes its own copy of the host's mounts and reaps what the verifier leaves behind; the agent's init
starts the image's ENTRYPOINT, says whether it handed over, and reaps orphans. Both shield the host's private
folders from their side."""

import os
import resource
import signal
import sys
import time

from .kernel import (
    CLONE_NEWNS,
    CLONE_NEWPID,
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_PRIVATE,
    MS_RDONLY,
    MS_REC,
    MS_REMOUNT,
    mount,
    unshare,
)
from .names import DECOY_MOUNTS, LOG_PREFIX, PRIVATE_MOUNTS, RUN_DIR, SHARED_MEMORY, TESTS_FOLDER
from .processes import AGENT_OOM_SCORE, _exit_code, _pids, _report_and_exit, _restore_signals, _stat_fields, credentials
from .seccomp import confine

SETTLE_MAX_S = 10.0
"""How long the start waits, at most, for what the ENTRYPOINT left running to go quiet (a busy one never does)."""
SETTLE_QUIET_S = 0.05
"""A window in which nothing the ENTRYPOINT left running ran or used CPU: it is then waiting (a server, listening)."""
_BUSY_STATES = ("R", "D")
_UTIME = 11  # /proc/<pid>/stat's field 14 (utime; stime follows), counted after the command name


def verifier_init(command, user, handover, keep, program, report, go, file_limit, channel_folders):
    """PID 1 of the verifier's namespace. It starts the agent's side, waits until the host's private folders are
    mounted, takes a copy of the host's mounts with a /proc of its own and the channel's folder shielded (a
    folder of the host machine's: nothing may write there) and a /dev/shm of its own, then reaps orphans for ever:
    what the verifier leaves behind ends up here, where the daemon stops it."""
    try:
        for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(number, signal.SIG_IGN)
        helper = os.fork()
        if helper == 0:
            try:
                os.close(go)
                unshare(CLONE_NEWNS | CLONE_NEWPID)
                os.write(report, b"agent-split\n")
                init = os.fork()
                if init == 0:
                    shielded = tuple(path for path, _ in PRIVATE_MOUNTS) + channel_folders
                    agent_init(command, user, handover, keep, program, report, file_limit, shielded)
                os.close(report)
                os._exit(_exit_code(os.waitpid(init, 0)[1]))
            except BaseException as exc:  # noqa: BLE001
                _report_and_exit(report, "agent namespaces", exc)
        os.read(go, 16)  # the host's private folders are mounted (or the split failed and this returns empty)
        os.close(go)
        unshare(CLONE_NEWNS)
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        # What the verifier runs from /tests cannot be changed by anything it starts: bash reads its script as it
        # goes, so a program the tests run could otherwise append to the script the trusted shell is reading. Nor
        # can the host side's folder (what the daemon lays over the verifier's view comes from there). The daemon
        # fills both through its own, writable mounts of the same file systems.
        for folder in (TESTS_FOLDER, RUN_DIR):
            mount(None, folder, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
        _own_shared_memory()
        # Read-only: a program the tests run, as root like the test script, may not write the script's memory
        # through /proc/<pid>/mem (nor attach to it: see seccomp.py).
        _mount_proc(readonly=True)
        _shield_private_folders(channel_folders)
        confine(keep, program)
        os.write(report, b"verifier-ready\n")
        os.close(report)
    except BaseException as exc:  # noqa: BLE001
        _report_and_exit(report, "verifier init", exc)
    _reap_forever()


def agent_init(command, user, handover, keep, program, report, file_limit, shielded):
    """PID 1 of the agent's namespace: its own /proc, the host's folders (``shielded``) shielded, then COMMAND
    confined (as ``user`` unless empty), then reap orphans for ever."""
    try:
        _mount_proc()
        _shield_private_folders(shielded, DECOY_MOUNTS)
        if file_limit:  # inherited by everything the agent's side starts from here
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, file_limit))
        for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(number, signal.SIG_IGN)  # as a namespace init, anything else sent from inside is dropped
        confine(keep, program)
        main = os.fork()
        if main == 0:
            try:
                with open("/proc/self/oom_score_adj", "w") as handle:
                    handle.write(str(AGENT_OOM_SCORE))
                _restore_signals()
                os.close(report)
                if user:  # nothing of the agent exists yet, so /etc/passwd is still the image's
                    uid, gid, groups, home, _ = credentials(user)
                    os.setgroups(groups)
                    os.setgid(gid)
                    os.setuid(uid)
                    os.environ["HOME"] = home  # Docker sets the home of the user it runs as
                os.execvp(command[0], command)
            except BaseException as exc:  # noqa: BLE001
                sys.stderr.write("terminus-env: cannot start {!r}: {}\n".format(command, exc))
                os._exit(127)
    except BaseException as exc:  # noqa: BLE001
        _report_and_exit(report, "agent init", exc)
    _report_handover(command, main, handover, report)
    _reap_forever()


def _reap_forever():
    while True:
        try:
            os.wait()
        except ChildProcessError:
            time.sleep(1.0)
        except OSError:
            time.sleep(0.1)


def _shield_private_folders(paths, decoys=()):
    """Make each of the host's private folders (``paths``), and every folder above it, a mount point of the agent's
    own namespace. Since Linux 3.18, removing or renaming a folder that is a mount point only in another namespace
    succeeds and silently detaches that mount; a mount point of the caller's own namespace is refused (EBUSY), and
    the agent cannot unmount anything. Each folder of ``decoys`` (path, tmpfs options) becomes an empty, writable
    tmpfs of this side's own, so that what runs here (an ENTRYPOINT's ``chmod 777 /logs/verifier``) works as it
    would in a plain container, while nothing written there reaches the verifier; the others become empty and
    read-only."""
    decoys = dict(decoys)
    pinned = set()
    for path in paths:
        parts = path.strip("/").split("/")
        for depth in range(1, len(parts)):
            ancestor = "/" + "/".join(parts[:depth])
            if ancestor not in pinned:
                mount(ancestor, ancestor, None, MS_BIND | MS_REC)
                pinned.add(ancestor)
        if path in decoys:
            mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, decoys[path])
        else:
            mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=0555")


def _report_handover(command, main, handover, report):
    """Say whether the image's ENTRYPOINT handed over to the keep-alive command (its last words), then stop
    listening: after this the agent runs, and nothing from this process is trusted any more."""
    deadline = time.monotonic() + handover
    keep_alive = command[-2:]
    verdict = "no-handover"
    pause = 0.001  # most ENTRYPOINTs hand over within milliseconds: look soon, then every 10 ms
    while time.monotonic() < deadline:
        pid, status = os.waitpid(main, os.WNOHANG)
        if pid:
            verdict = "exited {}".format(_exit_code(status))
            break
        if _running_in_namespace(keep_alive):
            verdict = "ready"
            break
        time.sleep(pause)
        pause = min(pause * 2, 0.01)
    if verdict == "ready":
        _settle(main, SETTLE_MAX_S)
    else:  # after whatever the ENTRYPOINT wrote, on the same stream: the host reads the log up to here
        try:
            os.write(2, "{}handover {}\n".format(LOG_PREFIX, verdict).encode())
        except OSError:
            pass
    try:
        os.write(report, "handover {}\n".format(verdict).encode())
    finally:
        os.close(report)


def _settle(main, limit_s):
    """Wait, at most ``limit_s``, until what the ENTRYPOINT left running on this side (every process but this init
    and ``main``, now the keep-alive) is quiet: over SETTLE_QUIET_S none of it ran, waited on the disk or used CPU.
    An ENTRYPOINT hands over as soon as it has started a server in the background, and the server takes a while to
    listen; Harbor runs its own steps before the agent's first command, and tasks count on that (harbor-cookbook's
    dns-blacklisting queries its server in the solution's first command). With nothing left running, as in most
    images, this returns at once."""
    deadline = time.monotonic() + limit_s
    before = _activity(main)
    while before is not None and time.monotonic() < deadline:
        time.sleep(SETTLE_QUIET_S)
        after = _activity(main)
        if after is None or (before == after and not any(busy for busy, _ in after.values())):
            return
        before = after


def _activity(main):
    """For each process of this side but this init and ``main``: whether it runs (or waits on the disk), and the
    CPU ticks it has used; None when there is no such process."""
    activity = {}
    for pid in _pids():
        if pid in (os.getpid(), main):
            continue
        try:
            fields = _stat_fields(pid)
            activity[pid] = (fields[0] in _BUSY_STATES, int(fields[_UTIME]) + int(fields[_UTIME + 1]))
        except (OSError, IndexError, ValueError):
            continue
    return activity or None


def _running_in_namespace(argv):
    wanted = "\0".join(argv).encode() + b"\0"
    for pid in _pids():
        try:
            with open("/proc/{}/cmdline".format(pid), "rb") as handle:
                if handle.read() == wanted:
                    return True
        except OSError:
            continue
    return False


def _own_shared_memory():
    """The verifier's own /dev/shm, empty, of the container's size: the container's is one file system with the
    agent's side, so code the agent left there would reach the verifier through a link (a package folder, a path
    line of a ``.pth``) from a place the verifier's watch cannot attribute."""
    try:
        info = os.statvfs(SHARED_MEMORY)
    except FileNotFoundError:
        return
    size = max(info.f_blocks * info.f_frsize, 1 << 20)
    mount("tmpfs", SHARED_MEMORY, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size={}".format(size))


def _mount_proc(readonly=False):
    """A /proc for the new PID namespace, with the container's masks over it again (read-only parts, hidden files).
    ``readonly``: nothing may be written through it, ``/proc/<pid>/mem`` included (the open answers EROFS)."""
    masks = []
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            fields = line.split()
            point = fields[4].replace("\\040", " ")
            if point.startswith("/proc/"):
                fstype = fields[fields.index("-") + 1]
                masks.append((point, fstype, "ro" in fields[5].split(","), os.path.isdir(point)))
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for point, fstype, mask_readonly, is_dir in masks:
        if not os.path.exists(point):
            continue
        if fstype == "proc":
            mount(point, point, None, MS_BIND | MS_REC)
            if mask_readonly:
                mount(None, point, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
        elif is_dir:
            mount("tmpfs", point, "tmpfs", MS_RDONLY, "size=0")
        else:
            mount("/dev/null", point, None, MS_BIND)
    if readonly:
        mount(None, "/proc", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
