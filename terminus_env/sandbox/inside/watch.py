"""What the verifier ran (OpenWatch): fanotify on the verifier's and the agent's mounts while the verifier runs, and
the links changed in this container whose targets it opened."""

import ctypes
import errno
import glob
import os
import stat
import struct
import time

from .kernel import _libc
from .names import RUN_DIR
from .private_folders import VERIFIER_FOLDERS, _b64

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
