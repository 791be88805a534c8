"""Processes on every side of the container: starting them, always confined (Spawner), stopping a tree of them for
good, fork bombs included (kill_tree), the users they run as, and the capped buffer of what a child writes."""

import grp
import os
import pwd
import resource
import signal
import socket
import time

from .kernel import CLONE_NEWNS, CLONE_NEWPID, own_capabilities, setns, unshare
from .seccomp import agent_capabilities, confine

AGENT_OOM_SCORE = 1000  # the agent's processes are the first the OOM killer takes,
SIDE_OOM_SCORE = 900  # then the verifier's and the terminal's: the daemon, main and init (0) come last


def _stat_fields(pid):
    """Fields of /proc/<pid>/stat after the command name (state is [0], ppid [1], pgrp [2], session [3])."""
    with open("/proc/{}/stat".format(pid)) as handle:
        return handle.read().rsplit(")", 1)[1].split()


def identity_of(pid):
    """(start time, parent pid) of a live process, from /proc; raises OSError (gone) or ValueError."""
    fields = _stat_fields(pid)
    return int(fields[19]), int(fields[1])  # start time is stat's field 22, counted here after the command name


def _pids():
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def descendants(root):
    """Pids of every process below ``root``, found through /proc."""
    children = {}
    for pid in _pids():
        try:
            children.setdefault(int(_stat_fields(pid)[1]), []).append(pid)
        except (OSError, IndexError, ValueError):
            continue
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(root, rounds=500):
    """Stop for good ``root``, everything below it, and every process in their sessions.

    A fork bomb adds members while we kill, so the members are frozen first (SIGSTOP: a stopped process cannot
    fork), round after round until no new one appears, then killed. Sessions are remembered across rounds: the
    bomb's processes outlive the session leader that started them.
    """
    sessions = set()
    for _ in range(rounds):
        members = set([root] + descendants(root))
        for pid in members:
            try:
                if int(_stat_fields(pid)[3]) == pid:
                    sessions.add(pid)
            except (OSError, IndexError, ValueError):
                continue
        members.update(pid for pid in _pids() if _session(pid) in sessions)
        alive = [pid for pid in members if not _zombie(pid)]
        if not alive:
            return
        freeze_then_kill(alive)
        time.sleep(0.005)


def freeze_then_kill(pids):
    """Stop every one of ``pids``; once all are stopped, kill them. Called in rounds: a process that forks meanwhile
    is caught by the next round, and none of them can run to start another."""
    for pid in pids:
        _signal(pid, signal.SIGSTOP)
    if all(_stopped(pid) for pid in pids):
        for pid in pids:
            _signal(pid, signal.SIGKILL)


def _session(pid):
    try:
        return int(_stat_fields(pid)[3])
    except (OSError, IndexError, ValueError):
        return None


def _stopped(pid):
    try:
        return _stat_fields(pid)[0] in "TtZX"
    except (OSError, IndexError):
        return True


def _signal(pid, number):
    try:
        os.kill(pid, number)
    except OSError:
        pass


def _zombie(pid):
    try:
        return _stat_fields(pid)[0] in "ZX"
    except (OSError, IndexError):
        return True


def credentials(user):
    """(uid, gid, groups, home, name) for 'name', 'uid', 'name:group' or 'uid:gid'.

    Called only in a confined child: the lookup may load NSS modules from files the agent can write. Root needs no
    lookup at all, so a verifier running as root starts whatever the agent did to /etc/passwd.
    """
    if user in ("root", "0", "0:0", "root:root"):
        return 0, 0, [0], "/root", "root"
    name, _, group = user.partition(":")
    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except KeyError:
        if not name.isdigit():
            raise ValueError("no user {!r} in the container".format(name)) from None
        entry = None
    uid = entry.pw_uid if entry else int(name)
    if group:
        gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
    else:
        gid = entry.pw_gid if entry else uid
    groups = os.getgrouplist(entry.pw_name, gid) if entry else [gid]
    home = entry.pw_dir if entry else "/"
    return uid, gid, groups, home, entry.pw_name if entry else str(uid)


AGENT_STAGES = ("user", "workdir", "exec")
"""The steps of starting a process that read what the agent controls (its users, folders and programs): a failure
there is the agent's doing. Every other step is the daemon's own."""


class SpawnError(Exception):
    """A process could not be started: which step failed, and why (``errno`` when the kernel refused a fork)."""

    def __init__(self, message, code=None, stage=None):
        super().__init__(message)
        self.errno = code
        self.stage = stage


class Child:
    """A process the daemon started; for the agent's side, ``pid`` is the helper that waits for it."""

    def __init__(self, pid):
        self.pid = pid
        self.code = None  # exit code, or 128 + signal
        self.signal = None  # the signal that ended it

    def poll(self):
        if self.code is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.code = 255
                return self.code
            if pid:
                self.code = _exit_code(status)
                self.signal = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        return self.code

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(0.005)
        return self.code

    def kill(self):
        kill_tree(self.pid)
        self.wait()


def _exit_as(status):
    """End as ``status`` says the process waited for ended: with its code, or killed by its signal (so the daemon
    tells a program killed by a signal from one that exited with 128 + that number). No core is dumped for it."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if number != signal.SIGKILL:
            signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
    os._exit(_exit_code(status))


def _exit_code(status):
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


class Spawner:
    """Starts programs, always confined, on one of three sides:

    - ``agent``: in the agent's PID and mount namespaces, as the agent could have started it;
    - ``verifier``: in the verifier's namespaces: a PID namespace above the agent's (it sees the agent's processes,
      never the daemon or the container's main process) and the host's mounts, with a /proc of its own;
    - ``terminal``: in the agent's mount namespace but in a new PID namespace of its own, so that nothing on the
      agent's side can see, signal or trace it (the daemon's tmux control client).
    """

    def __init__(self, agent_init, verifier_init, programs, file_limit=0):
        self.programs = programs  # the seccomp filter of each side
        self.agent_rlimits = ((resource.RLIMIT_FSIZE, file_limit),) if file_limit else ()
        self.agent_caps = agent_capabilities()
        self.own_caps = own_capabilities()  # what a child starts with (the terminal's side has no /proc to ask)
        self.devnull = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
        self.namespaces = {
            "agent": _namespace_fds(agent_init, ("pid", "mnt")),
            "verifier": _namespace_fds(verifier_init, ("pid", "mnt")),
            "terminal": _namespace_fds(agent_init, ("mnt",)),
        }

    def spawn(self, argv, side, stdio, user=None, env=None, cwd=None, rlimits=()):
        """Start ``argv`` with ``stdio`` (three fds, or None for /dev/null); raise SpawnError if it cannot start."""
        if side not in self.namespaces:
            raise ValueError("side must be one of {}".format(", ".join(sorted(self.namespaces))))
        namespaces = self.namespaces[side]
        stdio = [self.devnull if fd is None else fd for fd in stdio]
        environ = dict(os.environ)
        environ.update(env or {})
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(read_end)
            os.close(write_end)
            raise SpawnError("fork: {}".format(exc), exc.errno, "fork") from None
        if pid == 0:  # only async-safe work from here: no locks, no imports, never return
            try:
                _close_fds_except([write_end] + stdio + [fd for fd, _ in namespaces])
                agent = side == "agent"
                _set_oom_score("self", AGENT_OOM_SCORE if agent else SIDE_OOM_SCORE)  # inherited by the grandchild
                for fd, flag in namespaces:
                    setns(fd, flag)
                    os.close(fd)
                if side == "terminal":
                    unshare(CLONE_NEWPID)
                try:
                    grandchild = os.fork()  # the first process inside the side's PID namespace
                except OSError as exc:  # the pids limit: say so with the errno, as for the first fork
                    _report_and_exit(write_end, "fork", exc)
                if grandchild == 0:
                    limits = tuple(rlimits) + (self.agent_rlimits if agent else ())
                    self._become(argv, stdio, user, environ, cwd, limits, write_end, self.programs[side])
                os.close(write_end)
                for fd in set(stdio):
                    os.close(fd)
                _exit_as(os.waitpid(grandchild, 0)[1])
            except BaseException as exc:  # noqa: BLE001 - report and leave; never unwind into the daemon
                _report_and_exit(write_end, "setns", exc)
        os.close(write_end)
        message = b""
        while True:
            chunk = os.read(read_end, 4096)
            if not chunk:
                break
            message += chunk
        os.close(read_end)
        if message:
            Child(pid).wait()
            stage, code, text = (message.decode("utf-8", "replace").split("\0", 2) + ["", ""])[:3]
            raise SpawnError(text, int(code) if code.isdigit() and code != "0" else None, stage)
        return Child(pid)

    def _become(self, argv, stdio, user, environ, cwd, rlimits, report, program):
        stage = "stdio"
        try:
            copies = [os.dup(fd) for fd in stdio]
            for target, fd in enumerate(copies):
                os.dup2(fd, target)
            _close_fds_except([0, 1, 2, report])
            stage = "session"
            os.setsid()
            _restore_signals()
            stage = "confine"
            confine(self.agent_caps, program, self.own_caps)
            stage = "limits"
            for which, value in rlimits:
                resource.setrlimit(which, (value, value))
            if user:
                stage = "user"
                uid, gid, groups, home, name = credentials(user)
                environ.update(HOME=home, USER=name, LOGNAME=name)
                os.setgroups(groups)
                os.setgid(gid)
                os.setuid(uid)
            if cwd:
                stage = "workdir"
                os.chdir(cwd)
            stage = "exec"
            os.execvpe(argv[0], argv, environ)
        except BaseException as exc:  # noqa: BLE001 - report and leave; never unwind into the daemon
            _report_and_exit(report, stage, exc)


def _namespace_fds(pid, kinds):
    flags = {"pid": CLONE_NEWPID, "mnt": CLONE_NEWNS}
    return [(os.open("/proc/{}/ns/{}".format(pid, kind), os.O_RDONLY | os.O_CLOEXEC), flags[kind]) for kind in kinds]


def _restore_signals():
    """Programs expect default dispositions; Python set SIGPIPE and SIGXFSZ to ignore, and inits ignore more."""
    for name in ("SIGPIPE", "SIGXFSZ", "SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2"):
        number = getattr(signal, name, None)
        if number is not None:
            signal.signal(number, signal.SIG_DFL)


def stream_pair():
    """(ours, theirs): the two ends of a stream for a child's stdio. A socket pair, not a pipe: a pipe can be
    opened again through /proc/<pid>/fd by anyone who can see the child, a socket cannot, so nothing on the
    agent's side can write into what the daemon reads or sends."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    return ours.detach(), theirs.detach()


def _close_fds_except(keep):
    keep = set(keep)
    try:
        fds = [int(entry) for entry in os.listdir("/proc/self/fd")]
    except OSError:  # no /proc that shows this process (the terminal's side): close every range between
        bounds = sorted(fd for fd in keep if fd > 2)
        for low, high in zip([3] + [fd + 1 for fd in bounds], bounds + [os.sysconf("SC_OPEN_MAX")]):
            os.closerange(low, high)
        return
    for fd in fds:
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def _report_and_exit(fd, stage, exc):
    """Say which step failed and why (with the kernel's errno, if any) on ``fd``, and leave."""
    try:
        code = getattr(exc, "errno", None) or 0
        text = "{}\0{}\0{}: {}: {}".format(stage, code, stage, type(exc).__name__, exc)
        os.write(fd, text.encode("utf-8", "replace")[:4000])
    finally:
        os._exit(127)


def _set_oom_score(pid, score):
    with open("/proc/{}/oom_score_adj".format(pid), "w") as handle:  # raising needs no capability
        handle.write(str(score))


class CappedBuffer:
    """Keeps the first and last ``limit // 2`` bytes of a stream and counts what falls between."""

    def __init__(self, limit):
        self.half = max(limit // 2, 1)
        self.head = bytearray()
        self.tail = bytearray()
        self.omitted = 0

    def add(self, data):
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        self.tail += data
        extra = len(self.tail) - self.half
        if extra > 0:
            del self.tail[:extra]
            self.omitted += extra
