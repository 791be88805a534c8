"""The code that runs INSIDE a sandbox container (stdlib only, Python >= 3.6, Linux x86_64 or aarch64).

It plays two parts: the container's main process (started as ``main``) and the control daemon, which the main
process forks once the container is split.

``main``: the container's main process. Before anything of the task runs, it splits the container in three:
  - the agent's side: a PID and mount namespace whose init ("the agent's init") starts the image's ENTRYPOINT
    with the keep-alive command, then reaps orphans. Everything the agent ever runs lives there: the tmux
    terminal, its shell, whatever that shell starts, and the reference solution. It gets its own /proc, so it
    sees only its own processes, with Docker's masks of /proc copied over; the verifier's private folders and
    every folder above them are mount points here, so the agent can neither remove nor rename them;
  - the verifier's side: a PID namespace above the agent's (the verifier sees the agent's processes) with a
    mount namespace and a /proc of its own, where /tests, /logs/verifier and /run/terminus are fresh tmpfs
    mounts the agent's side never has;
  - the host's side (the container's first namespaces): this process and the control daemon, out of both
    other sides' sight.
  It keeps the container alive for the sandbox's lifetime, then exits, which ends the container.

The control daemon: a child of the main process on the host's side. The host connects to it once per container
  (take_channel): on a local engine through a socket in a folder of the host's mounted into the container, else
  through one long-lived ``docker exec``, a relay that hands its standard streams to the daemon over a socket only
  the host's side can reach. Either way the channel carries one JSON object per line each way, matched by ``id``.
  Every tmux operation, turn and verifier run is one round trip (well under a millisecond on a local engine)
  instead of a new ``docker exec`` (about 75 ms). Requests run on a fixed pool of threads, so a fork bomb that
  exhausts the pids limit cannot stop it answering. When its stdin closes, the owner process is gone (even after
  SIGKILL the kernel closes its socket), so it stops the container. While the verifier runs, it watches what the
  verifier opens (OpenWatch) and holds the root folder still (FrozenRoot).

Why the agent cannot forge a reply or a reward: the daemon is invisible from the agent's and the verifier's PID
namespaces (and not dumpable besides), so its pipes cannot be opened through /proc; the verifier's processes are
invisible from the agent's; the verifier's /tests and /logs/verifier are mounts the agent's side does not have,
and the daemon proves before and after each run that the verifier used those very mounts; and every process
started for the agent or the verifier runs with Docker's default capabilities and seccomp rules for a container
without CAP_SYS_ADMIN. Only the daemon keeps CAP_SYS_ADMIN, CAP_SYS_CHROOT, CAP_SETPCAP, CAP_NET_ADMIN and
CAP_LINUX_IMMUTABLE (to enter the sides' namespaces, drop capabilities for what it starts, watch the verifier
and hold the root folder still; the main process uses CAP_NET_ADMIN once, before anything of the task runs, to
cut a container with sidecars off the host); it never runs a program and imports nothing once the agent
exists, so no file the agent can write ever runs with them.

The host passes this file to the main process in its environment (channel.py); it must not import terminus_env.
"""

import base64
import ctypes
import errno
import fcntl
import glob
import grp
import io
import json
import linecache  # noqa: F401 - loaded now: tracebacks read source lines, and no import may happen later
import os
import pwd
import queue
import resource
import select
import signal
import socket
import stat
import struct
import sys
import tarfile
import threading
import time
import traceback
import warnings

FIONREAD = 0x541B
TIOCOUTQ = 0x5411
POLL_S = 0.002  # the idle check's longest pause
POLL_FIRST_S = 0.0002  # and its first: pauses double from here
WORKERS = 8  # request threads, started up front: a fork bomb may leave no pid for a new one
AGENT_OOM_SCORE = 1000  # the agent's processes are the first the OOM killer takes,
SIDE_OOM_SCORE = 900  # then the verifier's and the terminal's: the daemon, main and init (0) come last
LOG_PREFIX = "terminus-env: "  # on the main process's lines in the container's log
RUN_DIR = "/run/terminus"  # the host side's own tmpfs: the report of the container's split
SPLIT_REPORT = RUN_DIR + "/split"
CHANNEL_SOCKET = RUN_DIR + "/channel"  # where the daemon takes the relay's streams over (channel.py has the same)
CHANNEL_DIR = "/run/terminus-channel"  # a host folder a local engine mounts, where the host listens (DIRECT)
DIRECT, RELAY = "direct", "relay"  # how the host reaches the daemon (main's CHANNEL argument; channel.py has both)
HOSTS, CUT_OFF, AS_IS = "hosts", "cut-off", "as-is"  # what main does about the network first (sandbox.py has them)
CHANNEL_WAIT_S = 30.0  # how long the daemon waits for the host before it stops the container
SO_PEERCRED = 17
PRIVATE_MOUNTS = ((RUN_DIR, "size=1m,mode=0700"), ("/tests", "size=512m,mode=0755"),
                  ("/logs/verifier", "size=256m,mode=0777"))  # fmt: skip
# Only the daemon keeps these; everything it or the main process starts runs without them.
DAEMON_ONLY_CAPS = ("SYS_ADMIN", "SYS_CHROOT", "SETPCAP", "NET_ADMIN", "LINUX_IMMUTABLE")

# ----- the kernel's interfaces, through libc ------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NAME, PR_SET_SECCOMP = 1, 4, 15, 22
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 24, 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
SECCOMP_MODE_FILTER = 2
CLONE_NEWNS, CLONE_NEWPID = 0x00020000, 0x20000000
CLONE_NAMESPACES = 0x7E020000  # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    1, 2, 4, 8, 32, 4096, 16384, 1 << 18)  # fmt: skip
CAPABILITIES = (
    "CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP LINUX_IMMUTABLE NET_BIND_SERVICE "
    "NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER SYS_MODULE SYS_RAWIO SYS_CHROOT SYS_PTRACE SYS_PACCT "
    "SYS_ADMIN SYS_BOOT SYS_NICE SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP "
    "MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ PERFMON BPF CHECKPOINT_RESTORE"
).split()


def _ok(result, what):
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, "{}: {}".format(what, os.strerror(code)))


def prctl(option, arg2=0):
    _ok(_libc.prctl(option, ctypes.c_ulong(arg2), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)),
        "prctl({})".format(option))  # fmt: skip


def unshare(flags):
    _ok(_libc.unshare(flags), "unshare")


def setns(fd, nstype):
    _ok(_libc.setns(fd, nstype), "setns")


def mount(source, target, fstype, flags, data=None):
    def c(text):
        return None if text is None else text.encode()

    _ok(_libc.mount(c(source), c(target), c(fstype), ctypes.c_ulong(flags), c(data)), "mount " + target)


def capset(caps):
    """Effective and permitted become exactly ``caps`` (numbers); inheritable becomes empty."""
    mask = 0
    for cap in caps:
        mask |= 1 << cap
    header = struct.pack("Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = struct.pack("6I", mask & 0xFFFFFFFF, mask & 0xFFFFFFFF, 0, mask >> 32, mask >> 32, 0)
    _ok(_libc.capset(ctypes.c_char_p(header), ctypes.c_char_p(data)), "capset")


def own_capabilities():
    """The capability numbers in this process's bounding set."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("CapBnd:"):
                bits = int(line.split()[1], 16)
                return {cap for cap in range(64) if bits >> cap & 1}
    raise OSError(errno.ENOENT, "no CapBnd in /proc/self/status")


# ----- seccomp: Docker's rules for a container without CAP_SYS_ADMIN, on top of the container's own -----------

AUDIT_ARCH = {"x86_64": 0xC000003E, "i386": 0x40000003, "aarch64": 0xC00000B7}
# The syscalls Docker's default profile allows only with CAP_SYS_ADMIN, by ABI, and the io_uring calls, which its
# current profile denies to every container (they bypass seccomp's view of the calls they submit). clone is
# allowed without namespace flags; clone3 cannot be inspected, so it answers ENOSYS and libc falls back to clone.
_SYSCALLS = {
    # name: (x86_64, i386, aarch64); None where the ABI has no such call
    "clone": (56, 120, 220), "clone3": (435, 435, 435), "unshare": (272, 310, 97), "setns": (308, 346, 268),
    "mount": (165, 21, 40), "umount": (None, 22, None), "umount2": (166, 52, 39), "pivot_root": (155, 217, 41),
    "bpf": (321, 357, 280), "perf_event_open": (298, 336, 241), "fanotify_init": (300, 338, 262),
    "lookup_dcookie": (212, 253, 18), "name_to_handle_at": (303, 341, 264), "quotactl": (179, 131, 60),
    "quotactl_fd": (443, 443, 443), "setdomainname": (171, 121, 162), "sethostname": (170, 74, 161),
    "syslog": (103, 103, 116), "open_tree": (428, 428, 428), "move_mount": (429, 429, 429),
    "fsopen": (430, 430, 430), "fsconfig": (431, 431, 431), "fsmount": (432, 432, 432), "fspick": (433, 433, 433),
    "mount_setattr": (442, 442, 442), "io_uring_setup": (425, 425, 425), "io_uring_enter": (426, 426, 426),
    "io_uring_register": (427, 427, 427),
}  # fmt: skip
_ABI_COLUMN = {"x86_64": 0, "i386": 1, "aarch64": 2}
_NATIVE_ABIS = {"x86_64": ("x86_64", "i386"), "aarch64": ("aarch64",)}
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06


def seccomp_program(machine=None):
    """A classic BPF program (bytes of struct sock_filter) denying the calls above on this machine's ABIs.

    Calls from an ABI the machine does not natively run answer ENOSYS, as do x32 calls on x86_64.
    """
    machine = machine or os.uname().machine
    if machine not in _NATIVE_ABIS:
        raise OSError(errno.ENOSYS, "unsupported machine {!r}: the sandbox runs on x86_64 or aarch64".format(machine))
    code, labels = [], {}

    def emit(op, k=0, jt=None, jf=None):
        code.append([op, jt, jf, k])

    abis = _NATIVE_ABIS[machine]
    emit(_LD_W_ABS, 4)  # seccomp_data.arch
    for abi in abis:
        emit(_JEQ, AUDIT_ARCH[abi], jt="abi:" + abi)
    emit(_RET, _ERRNO | errno.ENOSYS)
    for abi in abis:
        labels["abi:" + abi] = len(code)
        emit(_LD_W_ABS, 0)  # seccomp_data.nr
        if abi == "x86_64":
            emit(_JGE, 0x40000000, jt="enosys")  # the x32 ABI
        column = _ABI_COLUMN[abi]
        for name, numbers in sorted(_SYSCALLS.items()):
            nr = numbers[column]
            if nr is None:
                continue
            target = {"clone": "clone:" + abi, "clone3": "enosys"}.get(name, "eperm")
            emit(_JEQ, nr, jt=target)
        emit(_RET, _ALLOW)
        labels["clone:" + abi] = len(code)
        emit(_LD_W_ABS, 16)  # the low half of args[0]: clone's flags on these little-endian ABIs
        emit(_JSET, CLONE_NAMESPACES, jt="eperm")
        emit(_RET, _ALLOW)
    labels["eperm"] = len(code)
    emit(_RET, _ERRNO | errno.EPERM)
    labels["enosys"] = len(code)
    emit(_RET, _ERRNO | errno.ENOSYS)
    out = []
    for index, (op, jt, jf, k) in enumerate(code):
        jumps = [0 if label is None else labels[label] - index - 1 for label in (jt, jf)]
        if not all(0 <= jump < 256 for jump in jumps):
            raise OverflowError("seccomp jump out of range")
        out.append(struct.pack("HBBI", op, jumps[0], jumps[1], k))
    return b"".join(out)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_seccomp(program):
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.addressof(buffer))
    _ok(_libc.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.c_void_p(ctypes.addressof(fprog)),
                    ctypes.c_ulong(0), ctypes.c_ulong(0)), "prctl(PR_SET_SECCOMP)")  # fmt: skip


def confine(keep, program, current=None):
    """Keep only the capabilities ``keep`` for good (bounding, effective, permitted), then add the filter.
    ``current``: this process's bounding set, where it has no /proc to read it from."""
    current = own_capabilities() if current is None else current
    for cap in sorted(current - keep):
        prctl(PR_CAPBSET_DROP, cap)
    try:
        prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    except OSError:  # kernels before 4.3 have no ambient set
        pass
    capset(keep & current)
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    install_seccomp(program)


def agent_capabilities():
    """What the agent's side keeps: the container's capabilities without the daemon's."""
    return own_capabilities() - {CAPABILITIES.index(name) for name in DAEMON_ONLY_CAPS}


# ----- processes -------------------------------------------------------------------------------------------------


def _stat_fields(pid):
    """Fields of /proc/<pid>/stat after the command name (state is [0], ppid [1], pgrp [2], session [3])."""
    with open("/proc/{}/stat".format(pid)) as handle:
        return handle.read().rsplit(")", 1)[1].split()


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
        for pid in alive:
            _signal(pid, signal.SIGSTOP)
        if all(_stopped(pid) for pid in alive):
            for pid in alive:
                _signal(pid, signal.SIGKILL)
        time.sleep(0.005)


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

    def poll(self):
        if self.code is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.code = 255
                return self.code
            if pid:
                self.code = _exit_code(status)
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

    def __init__(self, agent_init, verifier_init, program, file_limit=0):
        self.program = program
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
                    self._become(argv, stdio, user, environ, cwd, limits, write_end)
                os.close(write_end)
                for fd in set(stdio):
                    os.close(fd)
                os._exit(_exit_code(os.waitpid(grandchild, 0)[1]))
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

    def _become(self, argv, stdio, user, environ, cwd, rlimits, report):
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
            confine(self.agent_caps, self.program, self.own_caps)
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


# ----- the network: a container on its episode's network without a way to the host ------------------------------

RTM_NEWROUTE, RTM_DELROUTE, NLMSG_ERROR = 24, 25, 2
NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE = 0x1, 0x4, 0x200, 0x400
RT_TABLE_MAIN, RTPROT_BOOT, RT_SCOPE_UNIVERSE, RT_SCOPE_NOWHERE, RTN_UNREACHABLE, RTA_DST = 254, 3, 0, 255, 7, 1
RTF_GATEWAY = 0x2


def default_gateway():
    """The IPv4 gateway of the default route, or None."""
    with open("/proc/net/route") as handle:
        for line in handle.readlines()[1:]:
            fields = line.split()
            if len(fields) > 3 and fields[1] == "00000000" and int(fields[3], 16) & RTF_GATEWAY:
                return socket.inet_ntoa(struct.pack("<I", int(fields[2], 16)))
    return None


def route(op, destination, prefix, kind=0):
    """Add (RTM_NEWROUTE, of type ``kind``) or delete (RTM_DELROUTE) the IPv4 route to ``destination/prefix`` in
    the main table, through rtnetlink; raises OSError if the kernel refuses."""
    create = op == RTM_NEWROUTE
    flags = NLM_F_REQUEST | NLM_F_ACK | (NLM_F_CREATE | NLM_F_EXCL if create else 0)
    scope = RT_SCOPE_UNIVERSE if create else RT_SCOPE_NOWHERE  # NOWHERE: a deletion matches any scope
    body = struct.pack("BBBBBBBBI", socket.AF_INET, prefix, 0, 0, RT_TABLE_MAIN, RTPROT_BOOT if create else 0,
                       scope, kind, 0)  # fmt: skip
    if prefix:
        body += struct.pack("HH", 8, RTA_DST) + socket.inet_aton(destination)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as netlink:  # 0: NETLINK_ROUTE
        netlink.sendall(struct.pack("IHHII", 16 + len(body), op, flags, 1, 0) + body)
        reply = netlink.recv(65536)
    kind_of_reply, error = struct.unpack("H", reply[4:6])[0], struct.unpack("i", reply[16:20])[0]
    if kind_of_reply == NLMSG_ERROR and error:
        raise OSError(-error, "{} {}/{}: {}".format("route add" if create else "route del", destination, prefix,
                                                    os.strerror(-error)))  # fmt: skip


def cut_off_host():
    """On an internal network the host still answers: at the gateway's address, and through the default route at
    every address it has. Drop the default route and make the gateway unreachable, so the container reaches
    exactly the other containers on its network (the agent's side has no CAP_NET_ADMIN to undo it)."""
    gateway = default_gateway()
    if gateway is None:
        return
    route(RTM_NEWROUTE, gateway, 32, RTN_UNREACHABLE)
    route(RTM_DELROUTE, "0.0.0.0", 0)


NO_NETWORK_HOSTS = (b"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\n"
                    b"ff00::0\tip6-mcastprefix\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n")


def write_hosts():
    """A container started with its network disabled skips Docker's network set-up (about 200 ms of a start
    here) but gets an empty /etc/hosts, so `localhost` would not resolve: write what Docker writes for
    ``--network none``. The loopback device is up either way (runc brings it up)."""
    try:
        fd = os.open("/etc/hosts", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, NO_NETWORK_HOSTS)
            os.fchmod(fd, 0o644)
        finally:
            os.close(fd)
    except OSError as exc:  # the image's own business (a read-only or linked /etc/hosts): say so, go on
        sys.stderr.write(LOG_PREFIX + "cannot write /etc/hosts: {}\n".format(exc))


# ----- part 1: the container's main process ----------------------------------------------------------------------


def main_process(argv):
    """``main LIFETIME_S HANDOVER_S FILE_LIMIT_BYTES USER NETWORK CHANNEL -- COMMAND...``: split the container, run
    COMMAND on the agent's side as USER, the image's USER ("" for root), as Docker would have run the image's
    ENTRYPOINT (a file limit of 0 sets none). NETWORK says what to do first: CUT_OFF cuts the container off the
    host (see cut_off_host), HOSTS writes the /etc/hosts Docker gives a container without a network (see
    write_hosts), anything else nothing. CHANNEL says how the host reaches the daemon (DIRECT or RELAY, see
    take_channel). This process itself runs as root whatever the image says: it needs its capabilities.

    The split, in order: a helper makes the verifier's PID namespace, whose init ("the verifier's init") makes the
    agent's PID and mount namespaces; once those exist, this process mounts the host's private folders (so the
    agent's side never has them) and lets the verifier's init copy the host's mounts into a mount namespace of its
    own, with its own /proc. Every step reports a line on one pipe; the whole report lands in RUN_DIR/split.
    """
    lifetime, handover, file_limit, user, network, channel = float(argv[0]), float(argv[1]), int(argv[2]), *argv[3:6]
    command = argv[7:]
    channel_folders = (CHANNEL_DIR,) if channel == DIRECT else ()  # shielded on the agent's and the verifier's sides
    deadline = time.monotonic() + lifetime
    signal.signal(signal.SIGTERM, lambda *_: os._exit(143))
    if network == HOSTS:
        write_hosts()
    elif network == CUT_OFF:
        try:
            cut_off_host()
        except OSError as exc:  # nothing of the task may run then: say so to the daemon, which tells the host
            os.makedirs(RUN_DIR, exist_ok=True)
            _write_atomically(SPLIT_REPORT, "cannot cut the container off the host: {}\n".format(exc).encode())
            fork_daemon(file_limit, channel)  # which tells the host
            time.sleep(lifetime)
            os._exit(1)
    program = seccomp_program()
    keep = agent_capabilities()
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing mounted on one side reaches another
    for path, _ in PRIVATE_MOUNTS:
        os.makedirs(path, exist_ok=True)
    read_end, write_end = os.pipe()
    go_read, go_write = os.pipe()
    helper = os.fork()
    if helper == 0:
        try:
            os.close(read_end)
            os.close(go_write)
            unshare(CLONE_NEWPID)
            init = os.fork()
            if init == 0:
                verifier_init(command, user, handover, keep, program, write_end, go_read, file_limit, channel_folders)
            os.write(write_end, "verifier {}\n".format(init).encode())
            os.close(write_end)
            os.close(go_read)
            os._exit(_exit_code(os.waitpid(init, 0)[1]))
        except BaseException as exc:  # noqa: BLE001
            _report_and_exit(write_end, "verifier namespaces", exc)
    os.close(write_end)
    os.close(go_read)
    report = b""
    mounted = False
    while True:
        chunk = os.read(read_end, 4096)
        if not chunk:
            break
        report += chunk
        if not mounted and b"agent-split" in report:  # the agent's side keeps the bare folders
            for path, options in PRIVATE_MOUNTS:
                mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, options)
            mounted = True
            os.write(go_write, b"go")
            os.close(go_write)
    if not mounted:
        os.close(go_write)
    os.close(read_end)
    _write_atomically(SPLIT_REPORT, report)
    fork_daemon(file_limit, channel)
    confine(keep, program)
    for line in report.decode("utf-8", "replace").splitlines():  # the log's own lines, told apart by their prefix
        sys.stderr.write(LOG_PREFIX + line + "\n")
    sys.stderr.flush()
    while time.monotonic() < deadline:  # the lifetime backstop: the container ends with this process
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            pid = 0
        if not pid:
            time.sleep(min(1.0, max(deadline - time.monotonic(), 0)))
    os._exit(0)


def verifier_init(command, user, handover, keep, program, report, go, file_limit, channel_folders):
    """PID 1 of the verifier's namespace. It starts the agent's side, waits until the host's private folders are
    mounted, takes a copy of the host's mounts with a /proc of its own and the channel's folder shielded (a
    folder of the host machine's: nothing may write there), then reaps orphans for ever: what the verifier leaves
    behind ends up here, where the daemon stops it."""
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
        _mount_proc()
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
        _shield_private_folders(shielded)
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


def _shield_private_folders(paths):
    """Make each of the host's private folders (``paths``), and every folder above it, a mount point of the agent's
    own namespace. Since Linux 3.18, removing or renaming a folder that is a mount point only in another namespace
    succeeds and silently detaches that mount; a mount point of the caller's own namespace is refused (EBUSY), and
    the agent cannot unmount anything. The private folders themselves become empty and read-only here."""
    pinned = set()
    for path in paths:
        parts = path.strip("/").split("/")
        for depth in range(1, len(parts)):
            ancestor = "/" + "/".join(parts[:depth])
            if ancestor not in pinned:
                mount(ancestor, ancestor, None, MS_BIND | MS_REC)
                pinned.add(ancestor)
        mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=0555")


FS_IOC_GETFLAGS, FS_IOC_SETFLAGS, FS_IMMUTABLE_FL = 0x80086601, 0x40086602, 0x10


class FrozenRoot:
    """The root folder's own entries, immutable while the verifier runs (the inode's flag, so for every side): no
    `/pytest.ini` or `/conftest.py` can come and go, and no top-level folder can be renamed, in the meantime. Its
    subfolders stay writable, for the services the tests query and for the verifier itself."""

    def __init__(self):
        self.fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            self.flags = struct.unpack("i", fcntl.ioctl(self.fd, FS_IOC_GETFLAGS, b"\0" * 4))[0]
            fcntl.ioctl(self.fd, FS_IOC_SETFLAGS, struct.pack("i", self.flags | FS_IMMUTABLE_FL))
        except OSError as exc:
            os.close(self.fd)
            raise OSError(exc.errno, "cannot make the root folder immutable while the verifier runs ({}); the "
                                     "storage driver's file system must support it (ext4, xfs, btrfs)".format(
                                         exc.strerror)) from None  # fmt: skip

    def thaw(self):
        try:
            fcntl.ioctl(self.fd, FS_IOC_SETFLAGS, struct.pack("i", self.flags))
        finally:
            os.close(self.fd)


def _set_oom_score(pid, score):
    with open("/proc/{}/oom_score_adj".format(pid), "w") as handle:  # raising needs no capability
        handle.write(str(score))


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
    try:
        os.write(report, "handover {}\n".format(verdict).encode())
    finally:
        os.close(report)


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


def _mount_proc():
    """A /proc for the new PID namespace, with the container's masks over it again (read-only parts, hidden files)."""
    masks = []
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            fields = line.split()
            point = fields[4].replace("\\040", " ")
            if point.startswith("/proc/"):
                fstype = fields[fields.index("-") + 1]
                masks.append((point, fstype, "ro" in fields[5].split(","), os.path.isdir(point)))
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for point, fstype, readonly, is_dir in masks:
        if not os.path.exists(point):
            continue
        if fstype == "proc":
            mount(point, point, None, MS_BIND | MS_REC)
            if readonly:
                mount(None, point, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
        elif is_dir:
            mount("tmpfs", point, "tmpfs", MS_RDONLY, "size=0")
        else:
            mount("/dev/null", point, None, MS_BIND)


def _write_atomically(path, data):
    temporary = path + ".tmp"
    with open(temporary, "wb") as handle:
        handle.write(data)
    os.rename(temporary, path)


# ----- part 2: the control daemon --------------------------------------------------------------------------------


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


class Daemon:
    """The daemon's state: how to start processes, the two inits, the host's private folders, the terminal's tmux
    clients, and since when a file counts as changed in this container."""

    def __init__(self, agent_init, verifier_init, file_limit=0):
        self.agent_init = agent_init
        self.verifier_init = verifier_init
        self.verifier_pid_ns = os.readlink("/proc/{}/ns/pid".format(verifier_init))
        self.spawner = Spawner(agent_init, verifier_init, seccomp_program(), file_limit)
        self.tmux = Tmux(self.spawner)
        self.panes = {}  # the pane's pid in the agent's namespace -> its pid here
        self.private = {path: PrivateFolder(path) for path in VERIFIER_FOLDERS}
        self.verifying = threading.Lock()
        # Each side's root, held open with its mount points as they are now (no side can mount anything later):
        # the watch marks them even once the agent's side is stopped and its init gone.
        self.roots = {side: (os.open("/proc/{}/root".format(init), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC),
                             _mount_points(init))
                      for side, init in (("agent", agent_init), ("verifier", verifier_init))}  # fmt: skip
        # Image files carry the ctime of their layer's unpacking, older than the container; the kernel sets a
        # file's ctime on every change (write, chmod, rename, link) and nothing lets a process set it back.
        self.since = time.time() - CHANGE_MARGIN_S

    def run(self, argv, side, timeout, user=None, env=None, cwd=None, max_output=1000000, tick=None):
        """Run argv to its end (or the timeout, which kills what it started); collect its output, capped. ``tick``
        is called every few milliseconds meanwhile, on this thread (a fork bomb may leave no pid for another)."""
        buffer = CappedBuffer(int(max_output))
        start = time.monotonic()
        read_end, write_end = stream_pair()
        try:
            child = self.spawner.spawn(argv, side, (None, write_end, write_end), user=user, env=env, cwd=cwd)
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        try:
            deadline = start + float(timeout)
            timed_out, open_ = False, True
            while child.poll() is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    child.kill()
                    break
                if open_:
                    open_ = _drain(read_end, buffer, min(left, 0.05))
                else:
                    time.sleep(min(left, 0.005))
                if tick is not None:
                    tick()
            # Background children may hold the pipe open; stop reading shortly after the command is done.
            end = time.monotonic() + 1.0
            while open_ and time.monotonic() < end:
                open_ = _drain(read_end, buffer, end - time.monotonic())
        finally:
            os.close(read_end)
        return {
            "exit_code": 124 if timed_out else child.code,
            "timed_out": timed_out,
            "head": buffer.head.decode("utf-8", "replace"),
            "tail": buffer.tail.decode("utf-8", "replace"),
            "omitted": buffer.omitted,
            "duration_s": time.monotonic() - start,
        }

    def read_private(self, path, max_bytes):
        for root, folder in self.private.items():
            if path.startswith(root + "/"):
                return folder.read(path[len(root) + 1 :], max_bytes)
        raise ValueError("the verifier's files are read from {} only, not {}".format(" or ".join(self.private), path))

    def stop_verifier_leftovers(self, rounds=500):
        """Kill everything in the verifier's PID namespace but its init, so nothing the verifier started outlives it
        (a leftover could rewrite the reward once the verifier ended). The agent's processes live a level below.
        Members are frozen first, as in kill_tree, so a fork bomb cannot outrun the killing."""
        for _ in range(rounds):
            alive = [pid for pid in _pids() if pid != self.verifier_init and self._in_verifier_namespace(pid)
                     and not _zombie(pid)]  # fmt: skip
            if not alive:
                return
            for pid in alive:
                _signal(pid, signal.SIGSTOP)
            if all(_stopped(pid) for pid in alive):
                for pid in alive:
                    _signal(pid, signal.SIGKILL)
            time.sleep(0.005)

    def _in_verifier_namespace(self, pid):
        try:
            return os.readlink("/proc/{}/ns/pid".format(pid)) == self.verifier_pid_ns
        except OSError:
            return False

    def pane_pid(self, ns_pid):
        """The pane shell's pid in this namespace, from its pid in the agent's (what tmux reports)."""
        known = self.panes.get(ns_pid)
        if known is not None and _ns_pids(known)[-1:] == [ns_pid]:
            return known
        for pid in _pids():
            levels = _ns_pids(pid)
            if len(levels) == 3 and levels[2] == ns_pid:  # here, the verifier's namespace, the agent's
                self.panes[ns_pid] = pid
                return pid
        return None


def _ns_pids(pid):
    try:
        with open("/proc/{}/status".format(pid)) as handle:
            for line in handle:
                if line.startswith("NSpid:"):
                    return [int(value) for value in line.split()[1:]]
    except (OSError, ValueError):
        pass
    return []


def _drain(fd, buffer, wait_s):
    """Read what ``fd`` has within ``wait_s``; False at end of file."""
    ready, _, _ = select.select([fd], [], [], max(wait_s, 0))
    if not ready:
        return True
    chunk = os.read(fd, 65536)
    buffer.add(chunk)
    return bool(chunk)


def control_quote(arg):
    """A double-quoted argument for tmux's command parser (used by control mode)."""
    out = ['"']
    for ch in arg:
        if ch in '\\"$':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append("\\{:03o}".format(ord(ch)))
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


class ControlClient:
    """A tmux control-mode client kept attached, so a tmux command costs a line on a pipe, not a fork.

    It runs on the terminal's side: in the agent's mount namespace, to reach the tmux server's socket, but in a PID
    namespace of its own, so no process of the agent's can see, signal or trace it and forge what it reads. What
    it answers only ever feeds the agent's own terminal operations, and nothing it sends can stop the daemon. Each
    command answers with a %begin/%end (or %error) block; notifications outside blocks are skipped; pane output is
    switched off.
    """

    def __init__(self, spawner, tmux, target, user):
        ours, theirs = stream_pair()
        try:
            self.child = spawner.spawn(tmux + ["-C", "attach-session", "-t", target], "terminal",
                                       (theirs, theirs, None), user=user)  # fmt: skip
        except BaseException:
            os.close(ours)
            raise
        finally:
            os.close(theirs)
        self.stdin = ours
        self.stdout = os.fdopen(os.dup(ours), "rb")
        self.lock = threading.Lock()
        self.blocks = queue.Queue()
        threading.Thread(target=self.read_blocks, daemon=True).start()
        self.run([["refresh-client", "-f", "no-output"]])

    def read_blocks(self):
        current, begin = None, None
        try:
            for raw in self.stdout:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                if current is None:
                    if line.startswith("%begin "):
                        current, begin = [], line.split()
                    continue
                words = line.split()
                if words[:1] in (["%end"], ["%error"]) and words[1:3] == begin[1:3]:
                    if begin[3:4] == ["1"]:  # flag 1: the answer to one of our commands
                        self.blocks.put((words[0] == "%end", current))
                    current = None
                else:
                    current.append(line)
        except (OSError, ValueError):
            pass
        self.blocks.put(None)

    def run(self, commands):
        """(ok, outputs) of a list of commands run as one tmux command list (atomically): each command's output
        apart, up to the first that failed."""
        line = " ; ".join(" ".join(control_quote(arg) for arg in command) for command in commands)
        with self.lock:
            data = line.encode("utf-8", "surrogateescape") + b"\n"
            while data:
                data = data[os.write(self.stdin, data) :]
            outputs, ok = [], True
            for _ in commands:
                block = self.blocks.get(timeout=30)
                if block is None:
                    raise EOFError("the tmux control client exited")
                ok, lines = block
                outputs.append("".join(line + "\n" for line in lines))
                if not ok:
                    break
        return ok, outputs

    def alive(self):
        return self.child.poll() is None

    def close(self):
        for closing in (lambda: os.close(self.stdin), self.stdout.close, self.child.kill):
            try:
                closing()
            except OSError:
                pass


class Tmux:
    """Runs tmux commands for one session: through a control client, or a tmux process per call as fallback."""

    def __init__(self, spawner):
        self.spawner = spawner
        self.lock = threading.Lock()
        self.clients = {}

    def run(self, req, commands):
        """(ok, output) of the commands, run as one command list; the outputs joined."""
        ok, outputs = self.run_each(req, commands)
        return ok, "".join(outputs)

    def run_each(self, req, commands):
        """(ok, outputs): each command's output apart. Through the control client, the list runs at once, with no
        pane update in between; a tmux process per command is the fallback."""
        key = (tuple(req["tmux"]), req["target"], req.get("user"))
        try:
            return self.client(key).run(commands)
        except (OSError, EOFError, SpawnError, queue.Empty):
            self.drop(key)
        if len(commands) > 1 and all(command[0] == "send-keys" for command in commands):  # keys: one process
            ok, out = self.run_process(req, commands)
            return ok, [out]
        outputs = []
        for command in commands:
            ok, out = self.run_process(req, [command])
            outputs.append(out)
            if not ok:
                return False, outputs
        return True, outputs

    def client(self, key):
        with self.lock:
            client = self.clients.get(key)
            if client is None or not client.alive():
                client = self.clients[key] = ControlClient(self.spawner, list(key[0]), key[1], key[2])
            return client

    def drop(self, key):
        with self.lock:
            client = self.clients.pop(key, None)
        if client is not None:
            client.close()

    def run_process(self, req, commands):
        argv = list(req["tmux"])
        for index, command in enumerate(commands):
            # As argv, an argument ending in ';' separates commands, and a final '\\;' means ';'.
            argv += ([";"] if index else []) + [arg[:-1] + "\\;" if arg.endswith(";") else arg for arg in command]
        return self.spawn_tmux(argv, req.get("user"))

    def spawn_tmux(self, argv, user):
        out_read, out_write = stream_pair()
        err_read, err_write = stream_pair()
        try:
            child = self.spawner.spawn(argv, "agent", (None, out_write, err_write), user=user)
        except BaseException:
            os.close(out_read)
            os.close(err_read)
            raise
        finally:
            os.close(out_write)
            os.close(err_write)
        out, err = CappedBuffer(4000000), CappedBuffer(100000)
        with os.fdopen(out_read, "rb") as out_file, os.fdopen(err_read, "rb") as err_file:
            streams = {out_file.fileno(): out, err_file.fileno(): err}
            deadline = time.monotonic() + 30
            while streams and time.monotonic() < deadline:
                ready, _, _ = select.select(list(streams), [], [], 0.5)
                for fd in ready:
                    chunk = os.read(fd, 65536)
                    if chunk:
                        streams[fd].add(chunk)
                    else:
                        del streams[fd]
        code = child.wait(5)
        if code is None:
            child.kill()
            code = child.code
        text = (bytes(out.head) + bytes(out.tail)).decode("utf-8", "replace")
        error = (bytes(err.head) + bytes(err.tail)).decode("utf-8", "replace")
        return code == 0, text if code == 0 else error


class ShellExited(Exception):
    """The pane's shell is a zombie: it exited and tmux has not reaped it yet."""


class Shell:
    """What /proc and the pty say about the shell in the tmux pane."""

    def __init__(self, pid, tty):
        if not (tty.startswith("/dev/pts/") and tty[len("/dev/pts/") :].isdigit()):
            raise ShellExited()  # tmux reported something that is not a pane's terminal
        self.pid = pid
        self.tty = os.open(tty, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)

    def close(self):
        os.close(self.tty)

    def switches(self):
        total = 0
        with open("/proc/{}/status".format(self.pid)) as handle:
            for line in handle:
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    total += int(line.split()[1])
        return total

    def queued(self, request):
        return struct.unpack("i", fcntl.ioctl(self.tty, request, b"\0\0\0\0"))[0]

    def idle(self, before):
        """At its prompt: asleep, owning the terminal, has run since the keys were sent, no bytes in flight."""
        fields = _stat_fields(self.pid)
        state, pgrp, tpgid = fields[0], int(fields[2]), int(fields[5])
        if state in "ZX":
            raise ShellExited()
        if state != "S" or tpgid != pgrp:
            return False
        if before is not None and self.switches() == before:
            return False
        if self.queued(FIONREAD) or self.queued(TIOCOUTQ):
            return False
        return not self.group_busy(pgrp)

    def group_busy(self, pgrp):
        """A process in the shell's own group means a command substitution or similar is still running.
        (getpgid is one system call per process; reading each /proc/<pid>/stat cost ten times as much.)"""
        for pid in _pids():
            if pid != self.pid:
                try:
                    if os.getpgid(pid) == pgrp:
                        return True
                except OSError:
                    continue
        return False


def op_exec(daemon, req):
    return daemon.run(["bash", "-c", req["cmd"]], "agent", req["timeout"], user=req.get("user"), env=req.get("env"),
                      cwd=req.get("workdir"), max_output=req.get("max_output", 1000000))  # fmt: skip


# The container's own counters of forks refused at the pids limit and of OOM kills (cgroup v1, then v2).
LIMIT_COUNTERS = {
    "pids": (("/sys/fs/cgroup/pids/pids.events", "max"), ("/sys/fs/cgroup/pids.events", "max")),
    "memory": (("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill"), ("/sys/fs/cgroup/memory.events", "oom_kill")),
}


def limit_counters():
    """{limit: count} of the times the container hit its pids or memory limit so far (where the kernel says)."""
    counts = {}
    for limit, places in LIMIT_COUNTERS.items():
        for path, key in places:
            try:
                with open(path) as handle:
                    for line in handle:
                        name, _, value = line.partition(" ")
                        if name == key:
                            counts[limit] = int(value)
            except (OSError, ValueError):
                continue
            if limit in counts:
                break
    return counts


def op_verify(daemon, req):
    with daemon.verifying:  # one at a time: each holds the root folder still and empties the same folders
        return _verify(daemon, req)


def _verify(daemon, req):
    """Fresh /tests (from the tar the host sent) and /logs/verifier, the verifier run in its own namespaces, then
    the files it wrote, which limits the container hit while it ran (a verifier starved of pids or memory proves
    nothing), and what it ran that changed in this container (see OpenWatch).

    The folders are the verifier side's own tmpfs mounts, held open since the daemon started: before and after the
    run, the path the verifier uses must still lead to them, else the agent's side tampered with them (it cannot:
    see _shield_private_folders) and nothing of the run is trusted. What the verifier leaves running is stopped
    before its files are read."""
    # What changes from here on, by another than the verifier, changed while it ran. No margin: a change made
    # before this moment has an older ctime (the kernel's coarse clock only ever lags), and the verifier starts
    # milliseconds later, after the folders, the tests and the freeze.
    window = time.time()
    before = limit_counters()
    verifier_root = "/proc/{}/root".format(daemon.verifier_init)
    for folder in daemon.private.values():
        folder.check()
        folder.check(verifier_root)
        folder.empty()
    tests = base64.b64decode(req["tests"])
    if tests:
        daemon.private["/tests"].unpack(tests)
    frozen = FrozenRoot()
    try:
        watch = OpenWatch(daemon, window)
        try:
            result = daemon.run(
                ["bash", "-c", req["cmd"]], "verifier", req["timeout"], user=req.get("user"), env=req.get("env"),
                cwd=req.get("workdir"), max_output=req.get("max_output", 100000), tick=watch.drain,
            )  # fmt: skip
            daemon.stop_verifier_leftovers()
            watched = watch.finish(daemon, req.get("workdir") or "/")
        finally:
            watch.close()
    finally:
        frozen.thaw()
    for folder in daemon.private.values():
        folder.check()
        folder.check(verifier_root)
    max_bytes = int(req.get("max_bytes", 4000000))
    result["files"], result["refused"] = {}, {}
    for path in req.get("read", []):
        try:
            result["files"][path] = _b64(daemon.read_private(path, max_bytes))
        except NotRegular as exc:
            result["files"][path] = None
            result["refused"][path] = str(exc)
    after = limit_counters()
    result["limits_hit"] = sorted(limit for limit, count in after.items() if count > before.get(limit, count))
    result.update(watched)
    return result


class AgentFault(Exception):
    """Something the agent's side controls made the request impossible; the host counts it as the agent's doing."""


class NotRegular(OSError):
    """A file the verifier left is not a regular file (a folder, a FIFO, a link): its content is not trusted."""


VERIFIER_FOLDERS = ("/tests", "/logs/verifier")
CHANGE_MARGIN_S = 1.0  # ctime is kept in coarse clock ticks: what changed just before the daemon started counts too
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class PrivateFolder:
    """One of the host's private tmpfs folders, held open since the daemon started: what the verifier gets must
    be this very folder, and everything read from or deleted in it goes through this descriptor, never a path."""

    def __init__(self, path):
        self.path = path
        self.fd = os.open(path, _DIR_FLAGS)
        mine = os.fstat(self.fd)
        if mine.st_dev == os.stat("/").st_dev:
            raise OSError(errno.EIO, "{} is not the host's private mount".format(path))
        self.identity = (mine.st_dev, mine.st_ino)

    def check(self, root=""):
        """Raise AgentFault unless ``root + path`` still leads to this folder."""
        try:
            now = os.stat(root + self.path, follow_symlinks=False)
            found = (now.st_dev, now.st_ino)
        except OSError as exc:
            found = exc.strerror
        if found != self.identity:
            raise AgentFault("{}{} is no longer the verifier's private folder ({}): it was tampered with".format(
                root, self.path, found))  # fmt: skip

    def empty(self):
        _empty_dir(self.fd)

    def unpack(self, data):
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
            for member in archive.getmembers():
                bad = member.name.startswith("/") or ".." in member.name.split("/")
                if bad or not (member.isfile() or member.isdir()):
                    raise ValueError("refusing tests archive member {!r}: plain files and folders only"
                                     .format(member.name))  # fmt: skip
            archive.extractall("/proc/self/fd/{}".format(self.fd))

    def read(self, relative, max_bytes):
        """The file's first ``max_bytes`` bytes, None if missing; NotRegular unless it is a plain file."""
        parts = [part for part in relative.split("/") if part]
        fds = [self.fd]
        try:
            for part in parts[:-1]:
                fds.append(os.open(part, _DIR_FLAGS, dir_fd=fds[-1]))
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fds[-1])
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise NotRegular(exc.errno, "{}/{} cannot be read as a file: {}".format(self.path, relative,
                                                                                  exc.strerror)) from None
        finally:
            for opened in fds[1:]:
                os.close(opened)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise NotRegular(errno.EINVAL, "{}/{} is not a regular file".format(self.path, relative))
            return _read_fd(fd, max_bytes)
        finally:
            os.close(fd)


def _empty_dir(fd):
    """Delete everything in the folder open at ``fd``, never following a link."""
    for name in os.listdir(fd):
        try:
            mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
            if stat.S_ISDIR(mode):
                sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
                try:
                    _empty_dir(sub)
                finally:
                    os.close(sub)
                os.rmdir(name, dir_fd=fd)
            else:
                os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            continue


def _read_fd(fd, max_bytes):
    chunks, left = [], max_bytes
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _b64(data):
    return None if data is None else base64.b64encode(data).decode()


# ----- what the verifier ran: fanotify on the verifier's and the agent's mounts ----------------------------------

FAN_CLOEXEC, FAN_NONBLOCK, FAN_UNLIMITED_QUEUE, FAN_MARK_ADD, FAN_MARK_MOUNT = 0x1, 0x2, 0x10, 0x1, 0x10
FAN_CLOSE_WRITE, FAN_OPEN, FAN_Q_OVERFLOW, FAN_OPEN_EXEC = 0x8, 0x20, 0x4000, 0x1000
_EVENT = struct.Struct("IBBHQii")  # struct fanotify_event_metadata
_UNWATCHED = ("/proc", "/sys", "/dev", RUN_DIR) + VERIFIER_FOLDERS  # no file there is the agent's to change
MAX_WATCHED_FILES = 200000
GROUP_WAIT_S = 60.0  # how long a verifier waits for a fanotify group when the host's are all in use
HEAD_BYTES = 4096  # of a changed .pth or entry_points.txt file: its lines decide what runs
_READ_HEADS = (".pth", "/entry_points.txt")
PATH_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
LINK_DIRS = PATH_DIRS + ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib", "/lib/*-linux-gnu*",
                         "/usr/lib/*-linux-gnu*", "/usr/lib/python3*", "/usr/lib/python3*/*-packages",
                         "/usr/local/lib/python3*", "/usr/local/lib/python3*/*-packages", "/etc", "/etc/python3*",
                         "/root/.local/lib/python3*/site-packages")  # fmt: skip
MAX_LISTED = 2000  # libraries the verifier loaded, listed for the rules


class OpenWatch:
    """Every file the verifier's processes open or execute while it runs, and every file either side writes.

    Two fanotify groups (notification only, nothing is ever blocked): one on every mount of the verifier's
    namespace, one on every mount of the agent's. An event carries an open descriptor of the file, so what is
    recorded is the file the verifier really opened, wherever it was reached from and however briefly it existed.
    A file counts as changed in this container when its ctime is newer than the daemon, or the agent's side wrote
    it while the verifier ran; a file only the verifier itself wrote is its own. ``finish`` returns the changed
    files the verifier opened (path, executed, magic bytes, and the head of .pth files), the changed links in the
    program and library folders whose targets it opened, and whether the watch saw everything."""

    def __init__(self, daemon, window):
        self.groups = []
        self.window = window  # when the verifier's run began
        self.opened = {}  # (dev, ino) -> record
        self.written = {"verifier": set(), "agent": set()}
        self.complete = True
        self.events = 0
        self.exec_events = True
        try:
            verifier_mask = FAN_OPEN | FAN_OPEN_EXEC | FAN_CLOSE_WRITE
            self.groups.append(("verifier", self._group(daemon.roots["verifier"], verifier_mask)))
            self.groups.append(("agent", self._group(daemon.roots["agent"], FAN_CLOSE_WRITE)))
        except BaseException:
            self.close()
            raise

    def _group(self, side, mask):
        init_fn = getattr(_libc, "fanotify_init", None)
        if init_fn is None:
            raise OSError(errno.ENOSYS, "no fanotify_init in the C library: the verifier cannot be watched")
        deadline = time.monotonic() + GROUP_WAIT_S
        while True:
            fd = init_fn(FAN_CLOEXEC | FAN_NONBLOCK | FAN_UNLIMITED_QUEUE, os.O_RDONLY | os.O_LARGEFILE | os.O_CLOEXEC)
            code = ctypes.get_errno()
            if fd >= 0 or code != errno.EMFILE or time.monotonic() > deadline:
                break
            time.sleep(0.2)  # every verifier on this host holds two groups: wait for one to finish
        if fd < 0 and code == errno.EMFILE:
            raise OSError(code, "fanotify_init: every fanotify group of the host's root is in use (each running "
                                "verifier holds two): raise it on the sandbox host, e.g. `sysctl -w "
                                "fs.fanotify.max_user_groups=8192`")  # fmt: skip
        if fd < 0:
            raise OSError(code, "fanotify_init: {} (the verifier is watched with fanotify: Linux >= 5.0 with "
                                "CONFIG_FANOTIFY)".format(os.strerror(code)))  # fmt: skip
        root, points = side
        for point in points:
            if any(point == skip or point.startswith(skip + "/") for skip in _UNWATCHED):
                continue
            path = (point.lstrip("/") or ".").encode()  # resolved from the side's root, in its own mount tree
            if _libc.fanotify_mark(fd, FAN_MARK_ADD | FAN_MARK_MOUNT, ctypes.c_uint64(mask), root, path) != 0:
                code = ctypes.get_errno()
                if code == errno.EINVAL and mask & FAN_OPEN_EXEC:  # Linux < 5.0: no exec events, opens only
                    mask &= ~FAN_OPEN_EXEC
                    self.exec_events = False
                    if _libc.fanotify_mark(fd, FAN_MARK_ADD | FAN_MARK_MOUNT, ctypes.c_uint64(mask), root, path) == 0:
                        continue
                    code = ctypes.get_errno()
                if code in (errno.ENOENT, errno.EACCES):  # a mount point the agent made unreachable: a gap
                    self.complete = False
                    continue
                os.close(fd)
                raise OSError(code, "fanotify_mark {}: {}".format(point, os.strerror(code)))
        return fd

    def drain(self):
        """Read every event queued so far (the verifier's thread calls this while it waits)."""
        for side, group in self.groups:
            self._drain(side, group)

    def _drain(self, side, group):
        while True:
            try:
                data = os.read(group, 65536)
            except BlockingIOError:
                return
            offset = 0
            while offset + _EVENT.size <= len(data):
                length, _, _, _, mask, fd, _ = _EVENT.unpack_from(data, offset)
                offset += max(length, _EVENT.size)
                self.events += 1
                if mask & FAN_Q_OVERFLOW or fd < 0:
                    self.complete = False
                    continue
                try:
                    self._record(side, mask, fd)
                except OSError:
                    pass
                finally:
                    os.close(fd)

    def _record(self, side, mask, fd):
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return
        key = (info.st_dev, info.st_ino)
        if mask & FAN_CLOSE_WRITE:
            self.written[side].add(key)
        if side != "verifier" or not mask & (FAN_OPEN | FAN_OPEN_EXEC):
            return
        record = self.opened.get(key)
        if record is None:
            if len(self.opened) >= MAX_WATCHED_FILES:
                self.complete = False
                return
            path = os.readlink("/proc/self/fd/{}".format(fd))
            if info.st_nlink == 0 and path.endswith(" (deleted)"):  # gone already: its name when it went
                path = path[: -len(" (deleted)")]
            record = self.opened[key] = {"path": path, "exec": False, "ctime": 0.0, "head": None}
        record["exec"] = record["exec"] or bool(mask & FAN_OPEN_EXEC)
        record["ctime"] = max(record["ctime"], info.st_ctime)
        if record["head"] is None or (len(record["head"]) <= 4 and info.st_ctime >= self.window):
            # whole heads of the files whose lines decide what runs, and of whatever changed during the run
            # (renamed away, its name no longer says what it was: its content does)
            wide = record["path"].endswith(_READ_HEADS) or info.st_ctime >= self.window
            record["head"] = os.pread(fd, HEAD_BYTES if wide else 4, 0)

    def finish(self, daemon, workdir):
        """Once the verifier's processes are gone: read the last events and say what it ran that changed (``during``:
        changed since the start of the verifier's run, by another than the verifier), the links changed in this
        container whose targets it opened, and the libraries it loaded."""
        self.drain()
        window = self.window
        agent, verifier = self.written["agent"], self.written["verifier"]
        used = []
        for key, record in self.opened.items():
            changed = record["ctime"] >= daemon.since or key in agent
            if changed and (key not in verifier or key in agent):
                head = record["head"] or b""
                during = record["ctime"] >= window or key in agent
                wide = record["path"].endswith(_READ_HEADS) or during
                used.append({"path": record["path"], "exec": record["exec"], "magic": head[:4].hex(),
                             "head": _b64(head) if wide else None, "during": during})  # fmt: skip
        targets = {record["path"]: record["exec"] for record in self.opened.values()}
        loaded = sorted(record["path"] for record in self.opened.values()
                        if not record["exec"] and (record["head"] or b"")[:4] == b"\x7fELF")[:MAX_LISTED]
        return {"used": used, "relinked": _relinked(daemon.since, targets, workdir), "loaded": loaded,
                "watch": {"complete": self.complete, "events": self.events, "exec_events": self.exec_events}}

    def close(self):
        for _, fd in self.groups:
            try:
                os.close(fd)
            except OSError:
                pass
        self.groups = []


def _mount_points(pid):
    """The mount points of the process's mount namespace, as paths inside it."""
    points = []
    with open("/proc/{}/mountinfo".format(pid)) as handle:
        for line in handle:
            point = line.split()[4]
            points.append(point.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n"))
    return points


def _relinked(since, opened, workdir):
    """Links changed in this container, whose targets the verifier opened, in the folders where a name decides
    what runs: programs, libraries, Python's, the root folder (pytest's configuration) and the working folder."""
    found = []
    patterns = LINK_DIRS + ("/", workdir)
    for folder in sorted(set(os.path.realpath(path) for pattern in patterns for path in glob.glob(pattern))):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            path = os.path.join(folder, name)
            try:
                link = os.lstat(path)
                if not stat.S_ISLNK(link.st_mode) or link.st_ctime < since:
                    continue
                target = os.path.realpath(path)
            except OSError:
                continue
            if target in opened:
                found.append({"path": path, "target": target, "exec": opened[target]})
    return found


def op_lookup(daemon, req):
    """For each glob pattern, the paths that match now (and where their links lead), and whether each changed in
    this container (ctime)."""
    found = {}
    for pattern in req["patterns"]:
        matches = []
        for path in sorted(glob.glob(pattern))[:100]:
            try:
                changed = os.stat(path).st_ctime >= daemon.since
                matches.append({"path": path, "real": os.path.realpath(path), "changed": changed})
            except OSError:
                continue
        found[pattern] = matches
    return {"found": found}


def op_tmux(daemon, req):
    ok, out = daemon.tmux.spawn_tmux(req["argv"], req.get("user"))
    return {"rc": 0 if ok else 1, "out": out if ok else "", "err": "" if ok else out}


def op_commands(daemon, req):
    ok, out = daemon.tmux.run(req, req["commands"])
    return {"rc": 0 if ok else 1, "out": out if ok else "", "err": "" if ok else out}


def op_send(daemon, req):
    """Run the tmux calls that type the keys, then wait until the shell is idle or the time is up."""
    shell = _pane_shell(daemon, req)
    if shell is None:
        return {"gone": True}
    try:
        return _type_and_wait(daemon, shell, req, req["calls"], float(req["timeout"]))
    finally:
        shell.close()


def op_step(daemon, req):
    """A whole turn in one request: each command's keys typed and waited for in turn, while the turn's ``budget``
    (the agent's time left, None for none) lasts; then what is new on the terminal, and the screen."""
    shell = _pane_shell(daemon, req)
    if shell is None:
        return {"gone": True}
    budget, start, waited = req.get("budget"), time.monotonic(), []
    try:
        for command in req["commands"]:
            left = None if budget is None else float(budget) - (time.monotonic() - start)
            if left is not None and left <= 0:
                break
            timeout = float(command["timeout"]) if left is None else min(float(command["timeout"]), left)
            result = _type_and_wait(daemon, shell, req, command["calls"], timeout)
            if "waited" not in result:
                return result
            waited.append(result["waited"])
    finally:
        shell.close()
    result = _capture(daemon, req, screen=True)
    result["waited"] = waited
    return result


def _pane_shell(daemon, req):
    """The pane's shell, or None when it is gone."""
    pid = daemon.pane_pid(int(req["pane_pid"]))
    try:
        return Shell(pid, req["pane_tty"]) if pid is not None else None
    except (FileNotFoundError, ShellExited):
        return None


def _type_and_wait(daemon, shell, req, calls, timeout):
    """Type (the tmux calls), then wait until the shell is idle twice in a row, or ``timeout`` seconds. The first
    looks come quickly (most commands are done within a millisecond or two), and so does the look that confirms
    an idle one; pauses between busy looks double up to POLL_S."""
    try:
        before = shell.switches() if calls else None
        if calls:
            ok, out = daemon.tmux.run(req, calls)
            if not ok:
                return {"gone": not os.path.exists("/proc/{}".format(shell.pid)), "error": out.strip()}
        start = time.monotonic()
        stable, pause = 0, POLL_FIRST_S
        while True:
            stable = stable + 1 if shell.idle(before) else 0
            waited = time.monotonic() - start
            if stable >= 2 or waited >= timeout:
                return {"waited": waited, "idle": stable >= 2}
            time.sleep(min(POLL_FIRST_S if stable else pause, max(timeout - waited, 0)))
            pause = min(pause * 2, POLL_S)
    except ShellExited:
        return {"gone": True}
    except (OSError, ValueError, IndexError) as exc:
        gone = not os.path.exists("/proc/{}".format(shell.pid))
        return {"gone": gone, "error": None if gone else "{}: {}".format(type(exc).__name__, exc)}


def op_capture(daemon, req):
    return _capture(daemon, req, screen=bool(req.get("screen")))


def _capture(daemon, req, screen=False):
    """Lines from the anchor (absolute index: history size + cursor row at the last capture) to the screen's end,
    and with ``screen`` the visible screen too.

    The position, the lines and the screen are read in one tmux command list, which tmux runs without reading the
    pane in between. The host's last known history size is the first guess of where the anchor is; when output
    moved it, retry with the size just read.
    """
    target, anchor = req["target"], req.get("anchor")
    where = ["display-message", "-p", "-t", target, "#{history_size} #{cursor_y}"]
    visible = [["capture-pane", "-p", "-t", target]] if screen else []
    history = req.get("history")
    try:
        if history is None or anchor is None:
            ok, outputs = daemon.tmux.run_each(req, [where])
            if not ok:
                return {"rc": 1, "err": "".join(outputs)}
            history = int(outputs[0].split()[0])
        for _ in range(5):
            start = max(anchor - history, -history) if anchor is not None else 0
            lines = ["capture-pane", "-p", "-t", target, "-S", str(start), "-E", "-"]
            ok, outputs = daemon.tmux.run_each(req, [where, lines, where, *visible])
            if not ok:
                return {"rc": 1, "err": "".join(outputs)}
            first, text, last = outputs[0].strip(), outputs[1], outputs[2].strip()
            shown = {"screen": outputs[3]} if screen else {}
            if first == last and int(first.split()[0]) == history:
                return dict(rc=0, text=text.rstrip("\n"), history=history, cursor=int(first.split()[1]), start=start,
                            **shown)  # fmt: skip
            history = int(last.split()[0])
    except (ValueError, IndexError) as exc:  # the agent's side answered something that is not tmux's answer
        return {"rc": 1, "err": "unreadable answer from tmux ({})".format(exc)}
    return dict(rc=0, moving=True, **({"screen": outputs[3]} if screen and len(outputs) > 3 else {}))


def op_read(daemon, req):
    """A file as the host's side sees it (a FIFO or a folder there is refused, never waited on)."""
    try:
        fd = os.open(req["path"], os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return {"data": None}
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("{} is not a regular file".format(req["path"]))
        return {"data": _b64(_read_fd(fd, int(req["max_bytes"])))}
    finally:
        os.close(fd)


def op_stop_agent(daemon, req):
    """Kill every process on the agent's side (its init too, which ends its namespace); the container lives on."""
    if daemon.agent_init is not None:
        try:
            os.kill(daemon.agent_init, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return {}


def op_ping(daemon, req):
    return {"pid": os.getpid(), "agent_init": daemon.agent_init}


OPS = {
    "exec": op_exec, "verify": op_verify, "tmux": op_tmux, "commands": op_commands, "send": op_send, "step": op_step,
    "capture": op_capture, "read": op_read, "stop_agent": op_stop_agent, "ping": op_ping, "lookup": op_lookup,
}  # fmt: skip


def find_split():
    """The split as the main process reported it: (the agent's init, the verifier's init, the handover verdict),
    pids as this namespace sees them; raises if it failed."""
    with open(SPLIT_REPORT) as handle:
        report = handle.read()
    words = dict(line.partition(" ")[::2] for line in report.splitlines())
    agent = [pid for pid in _pids() if len(_ns_pids(pid)) == 3 and _ns_pids(pid)[-1] == 1]
    if "verifier-ready" not in words or "handover" not in words or len(agent) != 1:
        raise OSError(errno.EIO, "the container's split did not complete: " + report.replace("\0", " ").strip())
    return agent[0], int(words["verifier"]), words["handover"]


class _NoImports:
    """A meta-path finder that refuses every import: once the agent exists, files on disk are the agent's."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        raise ImportError("the sandbox daemon imports nothing after start-up ({})".format(name))

    find_module = find_spec  # Python < 3.4 spelling, harmless elsewhere


def fork_daemon(file_limit, channel):
    """Start the control daemon as a child of this process, on the host's side, once the container is split (or
    failed to split: the daemon tells the host why). It takes the host's channel (see take_channel), serves it
    until the host hangs up, then stops the container. Forking reuses this process's interpreter and compiled
    code, about 75 ms of CPU a start against a second interpreter."""
    if os.fork():
        return
    code = 0
    try:
        prctl(PR_SET_DUMPABLE, 0)
        _libc.prctl(PR_SET_NAME, ctypes.c_char_p(b"terminus-daemon"), 0, 0, 0)  # its cmdline is the main process's
        try:
            path = CHANNEL_DIR + "/channel" if channel == DIRECT else CHANNEL_SOCKET
            connection = take_channel(path, channel, CHANNEL_WAIT_S)
        except BaseException:  # the host gave up, or a peer that is not the host came: nobody will talk to it
            traceback.print_exc()
            os.kill(1, signal.SIGTERM)
            os._exit(1)
        daemon_main(file_limit)
        connection.close()
    except BaseException:  # noqa: BLE001 - a child of the main process must never return into it
        traceback.print_exc()
        code = 1
    finally:
        os._exit(code)


def take_channel(path, channel, wait_s):
    """Reach the host through socket ``path`` and make its channel this process's stdin and stdout. Returns the
    connection, to be held open until this process ends.

    DIRECT: the host listens on a socket in CHANNEL_DIR, a folder of the host's that a local engine mounts (the
    agent's and the verifier's sides have it covered), and this process connects to it; the peer must be outside
    the container's PID namespace (pid 0 as this process sees it), so nothing in the container can pose as the
    host. The socket carries the JSON lines both ways, and what this process writes to its stderr goes on it as
    lines of their own (ErrorLines). RELAY: the host's ``docker exec`` runs channel.py's relay, which connects to
    CHANNEL_SOCKET on the host's side (the agent's and the verifier's sides have their own RUN_DIR) and passes its
    stdin, stdout and stderr over; this process takes one connection from root, then removes the socket.
    """
    if channel == DIRECT:
        host = _connect_to_host(path, wait_s)
        os.dup2(host.fileno(), 0)
        os.dup2(host.fileno(), 1)
        sys.stderr = ErrorLines()
        return host
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        os.chmod(path, 0o600)
        listener.listen(1)
        listener.settimeout(wait_s)
        relay, _ = listener.accept()
    finally:
        listener.close()
        try:
            os.unlink(path)
        except OSError:
            pass
    relay.settimeout(None)
    _, uid = _peer(relay)
    if uid != 0:
        raise PermissionError("the channel's relay runs as uid {}, not root".format(uid))
    _, ancillary, _, _ = relay.recvmsg(1, socket.CMSG_SPACE(3 * 4))
    fds = [fd for level, kind, data in ancillary if (level, kind) == (socket.SOL_SOCKET, socket.SCM_RIGHTS)
           for fd in struct.unpack("{}i".format(len(data) // 4), data[: len(data) // 4 * 4])]  # fmt: skip
    if len(fds) != 3:
        raise OSError(errno.EPROTO, "the channel's relay passed {} streams, not 3".format(len(fds)))
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    return relay


def _connect_to_host(path, wait_s):
    """The host listens before the container starts: looks are for a host that is slow to, not a race."""
    deadline, pause = time.monotonic() + wait_s, 0.001
    while True:
        host = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            host.connect(path)
            break
        except (FileNotFoundError, ConnectionRefusedError):
            host.close()
            if time.monotonic() > deadline:
                raise socket.timeout("the host did not listen on {} within {} s".format(path, wait_s)) from None
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
    pid, uid = _peer(host)
    if pid != 0 or uid != 0:
        raise PermissionError("the channel's peer is process {} (uid {}) of this container, not the host"
                              .format(pid, uid))  # fmt: skip
    return host


def _peer(connection):
    """(pid, uid) of a unix socket's peer, as this process's namespaces see them (pid 0: outside them)."""
    pid, uid, _ = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, SO_PEERCRED, 12))
    return pid, uid


_SEND_LOCK = threading.Lock()


def send(message):
    """One JSON line to the host, whole: replies come from many threads."""
    data = (json.dumps(message) + "\n").encode()
    with _SEND_LOCK:
        while data:
            data = data[os.write(1, data) :]


class ErrorLines:
    """The daemon's stderr on a DIRECT channel: each line as ``{"stderr": line}`` (the container's log, where fd 2
    goes, is gone with the container; the host keeps what came for its diagnosis)."""

    def __init__(self):
        self.pending = ""
        self.lock = threading.Lock()  # tracebacks may come from several threads at once

    def write(self, text):
        with self.lock:
            self.pending += text
            *lines, self.pending = self.pending.split("\n")
        for line in lines:
            self._send(line + "\n")
        return len(text)

    def flush(self):
        with self.lock:
            pending, self.pending = self.pending, ""
        if pending:
            self._send(pending)

    @staticmethod
    def _send(text):
        try:
            send({"stderr": text})
        except OSError:  # the host is gone: nobody to tell
            pass


def daemon_main(file_limit):
    """Serve the host's requests on stdin/stdout, then stop the container when the host hangs up."""
    warnings.simplefilter("ignore")
    setup_error = None
    daemon = None
    try:
        agent_init_pid, verifier_init_pid, verdict = find_split()
        daemon = Daemon(agent_init_pid, verifier_init_pid, file_limit)
        handover = verdict
    except Exception as exc:  # noqa: BLE001 - answered to the host's first request
        setup_error = "{}: {}".format(type(exc).__name__, exc)
        handover = None
    sys.meta_path.insert(0, _NoImports)
    requests = queue.Queue()

    def serve():
        while True:
            req = requests.get()
            try:
                if setup_error is not None:
                    raise RuntimeError("the sandbox could not start: " + setup_error)
                result = OPS[req["op"]](daemon, req)
                if req["op"] == "ping":
                    result["handover"] = handover
                result.update(id=req["id"], ok=True)
            except SpawnError as exc:
                result = {"id": req.get("id"), "ok": False, "error": "cannot start a process: {}".format(exc),
                          "spawn_errno": exc.errno, "blame": "agent" if exc.stage in AGENT_STAGES else None}
            except AgentFault as exc:
                result = {"id": req.get("id"), "ok": False, "error": str(exc), "blame": "agent"}
            except Exception as exc:  # noqa: BLE001 - every failure goes back to the host, never kills the daemon
                detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
                result = {"id": req.get("id"), "ok": False, "error": detail}
            send(result)

    for _ in range(WORKERS):
        threading.Thread(target=serve, daemon=True).start()
    for line in sys.stdin.buffer:
        try:
            req = json.loads(line.decode())
            if not isinstance(req, dict):
                raise ValueError("a request must be a JSON object")
        except ValueError as exc:
            send({"id": None, "ok": False, "error": "unreadable request: {}".format(exc)})
            continue
        requests.put(req)
    os.kill(1, signal.SIGTERM)


if __name__ == "__main__" and sys.argv[1:2] == ["main"]:
    main_process(sys.argv[2:])
