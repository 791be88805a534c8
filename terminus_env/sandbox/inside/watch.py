"""What the verifier ran (OpenWatch): fanotify on the verifier's and the agent's mounts while the verifier runs, who
opened the reward, and the links changed in this container whose targets it opened."""

import ctypes
import errno
import os
import stat
import struct
import time

from .code_files import CODE_MAGIC, CODE_SUFFIXES, names_what_runs
from .installer_files import MAX_PROVEN_BYTES, installer_hook_candidate, proven_installer_file
from .kernel import _libc
from .links import links_opened
from .names import RUN_DIR, TESTS_FOLDER
from .packages import packaged_candidate, sha256_of
from .private_folders import _b64
from .processes import _stat_fields

FAN_CLOEXEC, FAN_NONBLOCK, FAN_UNLIMITED_QUEUE, FAN_MARK_ADD, FAN_MARK_MOUNT = 0x1, 0x2, 0x10, 0x1, 0x10
FAN_CLASS_CONTENT = 0x4
FAN_CLOSE_WRITE, FAN_OPEN, FAN_Q_OVERFLOW, FAN_OPEN_EXEC, FAN_OPEN_PERM = 0x8, 0x20, 0x4000, 0x1000, 0x10000
FAN_ALLOW, FAN_DENY = 0x1, 0x2
_EVENT = struct.Struct("IBBHQii")  # struct fanotify_event_metadata
_RESPONSE = struct.Struct("iI")  # struct fanotify_response

REWARD_FOLDER = "/logs/verifier"
REWARD_FILES = ("reward.txt", "reward.json")
# No file there can be code the agent provided: kernel views, terminals, message queues, the host's folder, the
# reward's (asked about apart). /dev itself (a tmpfs root may write) and the verifier's own /dev/shm are watched.
_UNWATCHED = ("/proc", "/sys", "/dev/pts", "/dev/mqueue", RUN_DIR, REWARD_FOLDER)
MAX_WATCHED_FILES = 200000  # files recorded: code, what names what runs, the agent's links' targets (data is not)
MAX_LOST_LISTED = 5  # reasons kept of the events the watch could not record
MAX_EARLY_CODE = 20000  # code files opened before the tests began, listed for the rules (a link may lead there)
GROUP_WAIT_S = 60.0  # how long a verifier waits for a fanotify group when the host's are all in use
HEAD_BYTES = 4096  # of a changed .pth or entry_points.txt file: its lines decide what runs
_READ_HEADS = (".pth", "/entry_points.txt")
MAX_LISTED = 2000  # libraries the verifier loaded, listed for the rules
_STARTTIME = 19  # /proc/<pid>/stat's field 22, counted after the command name


class OpenWatch:
    """Every file the verifier's processes open or execute while it runs, every file either side writes, and who
    opens the reward.

    Three fanotify groups. Two only take notice (nothing is blocked): one on every mount of the verifier's
    namespace, one on every mount of the agent's. An event carries an open descriptor of the file, so what is
    recorded is the file the verifier really opened, wherever it was reached from and however briefly it existed.
    A file counts as the agent's (changed in this container) when its ctime is newer than the daemon, or the
    agent's side wrote it while the verifier ran; a file only the verifier itself wrote is its own. What the
    verifier opens before its first test file (a Python file in /tests, or a ``test_*.py``/``*_test.py`` it did
    not write itself, such as the project's own tests) is opened ``early``: the runner starting up.

    A process that executed or opened code the agent provided, and every process below it, ran the agent's code.
    The third group asks before every open in /logs/verifier (fanotify's permission events): the reward files are
    opened only by the test script's own processes, never by one that ran the agent's code or that outlived its
    parent (orphans belong to no test script); such an open is refused, and any file such a process opened there
    cannot become the reward by a rename. The notices queued before that question are read first, so what a
    process ran is known before it asks."""

    def __init__(self, daemon, window, links=(), expects_tests=True, refuse_untrusted=True):
        self.daemon = daemon
        # Training refuses an untrusted process the reward; evaluation lets it write, as Harbor does, and reports it.
        self.refuse_untrusted = refuse_untrusted
        self.expects_tests = expects_tests  # the tests hold Python files, or a script names a test runner
        self.groups = []
        self.window = window  # when the verifier's run began
        self.opened = {}  # (dev, ino) -> record
        # Written by the agent's side, by the verifier's processes, and by those of them that ran the agent's code
        # (whatever such a process writes is the agent's: a wheel it unpacked, a module it rewrote).
        self.written = {"verifier": set(), "agent": set(), "tainted": set()}
        self.complete = True
        self.order = 0  # events recorded so far: a file's first open is told apart from the first test file's
        self.tests_began_at = None  # the order of the first test file opened
        self.runner_seen = False  # a file of a Python test runner's own package was opened
        self.tests_device = os.fstat(daemon.private[TESTS_FOLDER].fd).st_dev
        # Where the agent's links lead: a file reached by a link of the agent's never says that the tests began (a
        # start-up file Python reads, made a link to a test file, would otherwise say so).
        self.links = list(links)
        self.link_targets = frozenset(link["target"] for link in links)
        self.link_folders = tuple(link["target"].rstrip("/") + "/" for link in links if link.get("folder"))
        self.ran_agents_code = {}  # (pid, start time) -> the changed code files it opened (the agent's, unless its own)
        self.untrusted_files = {}  # (dev, ino) in /logs/verifier -> why no opener of it is trusted
        self.untrusted_rewards = []
        self.reported_rewards = set()  # (dev, ino) of the reward files an untrusted process opened by their name
        self.lost = []  # why events could not be recorded (the first MAX_LOST_LISTED)
        self.data_opened = 0  # opens of data that decides nothing, not recorded (see _may_decide)
        try:
            verifier_mask = FAN_OPEN | FAN_OPEN_EXEC | FAN_CLOSE_WRITE
            self.groups.append(("verifier", self._group(daemon.roots["verifier"], verifier_mask)))
            self.groups.append(("agent", self._group(daemon.roots["agent"], FAN_CLOSE_WRITE)))
            self.groups.append(("reward", self._group(daemon.roots["verifier"], FAN_OPEN_PERM, only=REWARD_FOLDER)))
        except BaseException:
            self.close()
            raise

    @property
    def fds(self):
        """The groups' descriptors: readable when an event waits (a permission event holds its opener until read)."""
        return [fd for _, fd in self.groups]

    def _group(self, side, mask, only=None):
        init_fn = getattr(_libc, "fanotify_init", None)
        if init_fn is None:
            raise OSError(errno.ENOSYS, "no fanotify_init in the C library: the verifier cannot be watched")
        flags = FAN_CLOEXEC | FAN_NONBLOCK | FAN_UNLIMITED_QUEUE | (FAN_CLASS_CONTENT if mask & FAN_OPEN_PERM else 0)
        deadline = time.monotonic() + GROUP_WAIT_S
        while True:
            fd = init_fn(flags, os.O_RDONLY | os.O_LARGEFILE | os.O_CLOEXEC)
            code = ctypes.get_errno()
            if fd >= 0 or code != errno.EMFILE or time.monotonic() > deadline:
                break
            time.sleep(0.2)  # every verifier on this host holds three groups: wait for one to finish
        if fd < 0 and code == errno.EMFILE:
            raise OSError(code, "fanotify_init: every fanotify group of the host's root is in use (each running "
                                "verifier holds three): raise it on the sandbox host, e.g. `sysctl -w "
                                "fs.fanotify.max_user_groups=8192`")  # fmt: skip
        if fd < 0:
            raise OSError(code, "fanotify_init: {} (the verifier is watched with fanotify: Linux >= 5.0 with "
                                "CONFIG_FANOTIFY)".format(os.strerror(code)))  # fmt: skip
        root, points = side
        for point in points if only is None else [only]:
            if only is None and any(point == skip or point.startswith(skip + "/") for skip in _UNWATCHED):
                continue
            path = (point.lstrip("/") or ".").encode()  # resolved from the side's root, in its own mount tree
            if _libc.fanotify_mark(fd, FAN_MARK_ADD | FAN_MARK_MOUNT, ctypes.c_uint64(mask), root, path) != 0:
                code = ctypes.get_errno()
                if code == errno.EINVAL and mask & FAN_OPEN_EXEC:  # Linux < 5.0: no exec events, opens only
                    mask &= ~FAN_OPEN_EXEC
                    if _libc.fanotify_mark(fd, FAN_MARK_ADD | FAN_MARK_MOUNT, ctypes.c_uint64(mask), root, path) == 0:
                        continue
                    code = ctypes.get_errno()
                if code in (errno.ENOENT, errno.EACCES) and only is None:  # made unreachable by the agent: a gap
                    self.complete = False
                    continue
                os.close(fd)
                raise OSError(code, "fanotify_mark {}: {}".format(point, os.strerror(code)))
        return fd

    def drain(self):
        """Read every event queued so far, and answer every question (the verifier's thread calls this as soon as
        a group has one, and a few times a second besides)."""
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
                length, _, _, _, mask, fd, pid = _EVENT.unpack_from(data, offset)
                offset += max(length, _EVENT.size)
                if mask & FAN_Q_OVERFLOW or fd < 0:
                    self.complete = False
                    continue
                try:
                    if side == "reward":
                        self._answer(group, fd, pid)
                    else:
                        self._record(side, mask, fd, pid)
                except OSError as exc:  # what cannot be seen or named is vouched for by no one: fail closed
                    self._lost("{} event of pid {}: {}".format(side, pid, exc))
                finally:
                    os.close(fd)

    def _lost(self, why):
        """An event the watch could not record (a file it cannot name: a real path past PATH_MAX)."""
        self.complete = False
        if len(self.lost) < MAX_LOST_LISTED:
            self.lost.append(why)

    def _record(self, side, mask, fd, pid):
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return
        key = (info.st_dev, info.st_ino)
        if mask & FAN_CLOSE_WRITE:
            self.written[side].add(key)
            if side == "verifier" and self._agents_code_ran() and self.tainted(pid):
                self.written["tainted"].add(key)
        if side != "verifier" or not mask & (FAN_OPEN | FAN_OPEN_EXEC):
            return
        self.order += 1
        record = self.opened.get(key)
        if record is None:
            path = _path(fd, info)
            in_tests = info.st_dev == self.tests_device  # the verifier's own tests, known by their mount
            if self.tests_began_at is None and self._begins_tests(path, info, key, in_tests):
                self.tests_began_at = self.order
            if not self.runner_seen and _is_runner_file(path):
                self.runner_seen = True
            if in_tests:  # the verifier's own, fresh each run
                return
            if not self._may_decide(path, key, info, mask, fd):
                self.data_opened += 1
                return
            if len(self.opened) >= MAX_WATCHED_FILES:
                self.complete = False
                return
            record = self.opened[key] = {"path": path, "exec": False, "ctime": 0.0, "head": None,
                                         "first": self.order}  # fmt: skip
        record["exec"] = record["exec"] or bool(mask & FAN_OPEN_EXEC)
        record["ctime"] = max(record["ctime"], info.st_ctime)
        if record["head"] is None or (len(record["head"]) <= 4 and info.st_ctime >= self.window):
            # whole heads of the files whose lines decide what runs, and of whatever changed during the run
            # (renamed away, its name no longer says what it was: its content does)
            wide = record["path"].endswith(_READ_HEADS) or info.st_ctime >= self.window
            record["head"] = os.pread(fd, HEAD_BYTES if wide else 4, 0)
        changed = info.st_ctime >= self.daemon.since or key in self.written["agent"] or key in self.written["tainted"]
        if changed and record.get("zip") is None:  # only what the agent may have provided is looked at so closely
            record["zip"] = _is_zip(fd, info.st_size)
            if installer_hook_candidate(record["path"]):
                record["proven"] = proven_installer_file(record["path"], _read_whole(fd, info.st_size))
            if record["path"].endswith(".pth"):
                record["pth_files"] = _pth_files(record["path"], record["head"])
        if "sha256" not in record and changed and _is_code(record) and packaged_candidate(record["path"]):
            record["sha256"] = sha256_of(fd, info.st_size)  # as loaded: the host may prove it a package's own
        if _is_code(record) and changed and not record.get("proven"):
            start = _start_time(pid)
            if start is not None:  # a process gone already can be no one's parent; its orphans are refused anyway
                self.ran_agents_code.setdefault((pid, start), []).append(key)

    def _may_decide(self, path, key, info, mask, fd):
        """Whether a file the verifier opened can decide anything the rules judge, so is recorded: code (by how it
        was opened, its name or its first bytes), a zip the agent's side may have made, a file whose name or place
        decides what runs, a target of the agent's links, or a file the agent's side wrote while the verifier ran.
        Other data, the image's or the agent's (a test reading thousands of output files), decides nothing: it is
        counted, not recorded, and is asked again at its next open (it may have changed meanwhile)."""
        if mask & FAN_OPEN_EXEC or path.endswith(CODE_SUFFIXES) or names_what_runs(path):
            return True
        if path in self.link_targets or path.startswith(self.link_folders) or key in self.written["agent"]:
            return True
        if os.pread(fd, 4, 0).startswith(CODE_MAGIC):
            return True
        changed = info.st_ctime >= self.daemon.since or key in self.written["tainted"]
        return changed and self._agents(key) and _is_zip(fd, info.st_size)

    def _begins_tests(self, path, info, key, in_tests):
        """Whether opening this file means the tests began: a Python file of the verifier's own tests (known by its
        mount), or a test file of the project's (``test_*.py``, ``*_test.py``, the image's or the agent's, not one the
        verifier wrote itself, as an installer unpacking a package's tests does); never a file that one of the
        agent's links leads to. Nothing Python or the loader reads at start-up has such a name: only a link could
        make a start-up read one."""
        if path in self.link_targets or path.startswith(self.link_folders):
            return False
        if in_tests:
            return _is_test_file(path, in_tests=True)
        return key not in self.written["verifier"] and _is_test_file(path)

    def _agents(self, key):
        """Whether a changed file is the agent's: not written by the verifier itself (a file it opens to write is
        told apart once it closes it), unless the agent's side, or a verifier process that ran the agent's code,
        wrote it too."""
        written = self.written
        return key in written["agent"] or key in written["tainted"] or key not in written["verifier"]

    def _agents_code_ran(self):
        """Whether any process has surely run code the agent provided so far: code changed before the verifier began,
        or written by the agent's side or by a process that ran its code. Until then no writer can be tainted,
        traced or not. A file made during the run by a writer whose event is not read yet (the verifier's own
        temporary script, read while its writer still holds it) does not count here."""
        written = self.written
        return any(key in written["agent"] or key in written["tainted"]
                   or (key in self.opened and self.opened[key]["ctime"] < self.window and self._agents(key))
                   for keys in self.ran_agents_code.values() for key in keys)  # fmt: skip

    def tainted(self, pid):
        """Whether ``pid``, or a process above it, ran code the agent provided; True where /proc can no longer tell
        (fail closed: a writer gone before its event was read counts as the agent's once anything ran its code)."""
        return self._ancestry(pid)[0] in ("ran", "untraced")

    def _ancestry(self, pid):
        """What the walk from ``pid`` up to the test script found: ("ran", why) when it or a process above it ran
        code the agent provided, ("orphan", why) when it left the test script's tree, ("untraced", why) when /proc
        cannot tell, (None, None) when it is the test script's own."""
        untraced = ("untraced", "could not be traced to the test script")
        current = pid
        for _ in range(4096):
            start = _start_time(current)
            if start is None:
                return untraced
            ran = next((key for key in self.ran_agents_code.get((current, start), ()) if self._agents(key)), None)
            if ran is not None:
                path = self.opened[ran]["path"] if ran in self.opened else "a file"
                return "ran", ("ran {}, which the agent provided".format(path) if current == pid else
                               "descends from pid {}, which ran {}, which the agent provided".format(current, path))
            try:
                parent = int(_stat_fields(current)[1])
            except (OSError, ValueError, IndexError):
                return untraced
            if parent == self.daemon.verifier_init:
                return "orphan", "outlived its parent: it belongs to no test script"
            if not self.daemon._in_verifier_namespace(parent):
                return None, None  # started by the daemon: the test script itself
            current = parent
        return untraced

    def _answer(self, group, fd, pid):
        """Allow or refuse an open in /logs/verifier; refused: a reward file opened by a process not to be trusted,
        and any open the daemon cannot judge (the question is always answered: an unanswered opener would hang)."""
        refuse = True
        try:
            self.drain_notices()
            why = self.untrusted(pid)
            info = os.fstat(fd)
            path = _path(fd, info)
            untrusted = why is not None and os.path.basename(path) in REWARD_FILES
            refuse = untrusted and self.refuse_untrusted
            if why is not None:
                self.untrusted_files[(info.st_dev, info.st_ino)] = "pid {} (which {})".format(pid, why)
            if untrusted:
                self.untrusted_rewards.append({"path": path, "pid": pid, "why": why, "refused": refuse})
                self.reported_rewards.add((info.st_dev, info.st_ino))
        finally:
            os.write(group, _RESPONSE.pack(fd, FAN_DENY if refuse else FAN_ALLOW))

    def drain_notices(self):
        for side, group in self.groups:
            if side != "reward":
                self._drain(side, group)

    def untrusted(self, pid):
        """Why ``pid`` may not write the reward (None: it is the test script's own): it, or a process above it, ran
        code the agent provided, or it has left the test script's tree. Fails closed when /proc cannot tell."""
        return self._ancestry(pid)[1]

    def check_rewards(self, folder_fd):
        """The reward files as they stand: one that a process not to be trusted opened (then renamed or linked into
        place) is refused too."""
        for name in REWARD_FILES:
            try:
                info = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
            except OSError:
                continue
            why = self.untrusted_files.get((info.st_dev, info.st_ino))
            if why is not None and (info.st_dev, info.st_ino) not in self.reported_rewards:
                self.untrusted_rewards.append({"path": "{}/{}".format(REWARD_FOLDER, name), "pid": 0,
                                            "why": "this file became the reward, but {} opened it".format(why),
                                            "refused": self.refuse_untrusted})

    def boundary(self):
        """The order where the tests began: every file first opened before it was opened by the runner starting up.
        Told by the first test file; where none was opened, a runner that started or tests that hold Python files or
        name a test runner make everything the runner's start (fail closed); scripts that name no test runner, with
        none started, are the test themselves, and only the rules that hold at any time apply (0)."""
        if self.tests_began_at is not None:
            return self.tests_began_at
        if self.runner_seen or self.expects_tests:
            return self.order + 1
        return 0

    def finish(self, daemon, workdir):
        """Once the verifier's processes are gone: read the last events and say what it ran that changed (``during``:
        changed since the start of the verifier's run, by another than the verifier; ``early``: first opened before
        the tests began), the code it opened before the tests began, the links changed in this container whose
        targets it opened, the libraries it loaded, and the refused openers of the reward."""
        self.drain()
        window = self.window
        boundary = self.boundary()
        for record in self.opened.values():
            record["early"] = record["first"] < boundary
        used = []
        for key, record in self.opened.items():
            changed = record["ctime"] >= daemon.since or key in self.written["agent"] or key in self.written["tainted"]
            if changed and self._agents(key):
                head = record["head"] or b""
                during = record["ctime"] >= window or key in self.written["agent"]
                wide = record["path"].endswith(_READ_HEADS) or during
                used.append({"path": record["path"], "exec": record["exec"], "magic": head[:4].hex(),
                             "head": _b64(head) if wide else None, "during": during, "early": record["early"],
                             "zip": bool(record.get("zip")), "proven": bool(record.get("proven")),
                             "pth_files": record.get("pth_files", []), "sha256": record.get("sha256")})
        early_code = sorted(record["path"] for record in self.opened.values() if record["early"] and _is_code(record))
        if len(early_code) > MAX_EARLY_CODE:
            self.complete = False
        targets = {record["path"]: record for record in self.opened.values()}
        loaded = sorted(record["path"] for record in self.opened.values()
                        if not record["exec"] and (record["head"] or b"")[:4] == b"\x7fELF")[:MAX_LISTED]
        # A link made while the verifier ran may lead to data that was not recorded: fail closed, as if opened early.
        unrecorded = _unrecorded_target if self.data_opened else None
        relinked = links_opened(daemon.since, self.window, targets, workdir, self.links, unrecorded)
        return {"used": used, "relinked": relinked, "loaded": loaded,
                "watch": {"complete": self.complete, "lost": self.lost, "early_code": early_code[:MAX_EARLY_CODE],
                          "untrusted_rewards": self.untrusted_rewards}}  # fmt: skip

    def close(self):
        for _, fd in self.groups:  # a permission event not yet answered is allowed when its group closes
            try:
                os.close(fd)
            except OSError:
                pass
        self.groups = []


def _path(fd, info):
    path = os.readlink("/proc/self/fd/{}".format(fd))
    if info.st_nlink == 0 and path.endswith(" (deleted)"):  # gone already: its name when it went
        path = path[: -len(" (deleted)")]
    return path


def _unrecorded_target(path):
    """A record for data a link leads to, which the watch may have opened without recording: opened early, not run.
    Code is always recorded when opened, so code without a record was not opened."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)  # never waits on a pipe
    except OSError:
        return None
    try:
        head = os.pread(fd, 4, 0) if stat.S_ISREG(os.fstat(fd).st_mode) else None
    except OSError:
        head = None
    finally:
        os.close(fd)
    if head is None or path.endswith(CODE_SUFFIXES) or head.startswith(CODE_MAGIC):
        return None
    return {"exec": False, "early": True, "head": head}


def _is_test_file(path, in_tests=False):
    """A file a test runner collects: a Python file in /tests, or ``test_*.py`` / ``*_test.py`` anywhere, or the
    bytecode of one (pytest loads its rewritten test modules from ``__pycache__`` without opening the source)."""
    folder, name = os.path.split(path)
    if os.path.basename(folder) == "__pycache__" and name.endswith(".pyc"):
        name = name.split(".")[0] + ".py"
    if not name.endswith(".py"):
        return False
    return in_tests or name.startswith("test_") or name.endswith("_test.py")


def _is_code(record):
    magic = (record["head"] or b"")[:4]
    return (record["exec"] or bool(record.get("zip")) or magic.startswith(CODE_MAGIC)
            or record["path"].endswith(CODE_SUFFIXES))  # fmt: skip


ZIP_END = b"PK\x05\x06"
ZIP_TAIL = 65535 + 22  # a zip's end record, with the longest comment it may carry


def _is_zip(fd, size):
    """Whether Python's zipimport (and pip, and zipfile) would read this file as a zip: they find the archive by its
    end record, looked for in its last 64 KiB, whatever comes before it; so is it found here."""
    if size < 22:
        return False
    tail = os.pread(fd, min(size, ZIP_TAIL), max(0, size - ZIP_TAIL))
    return ZIP_END in tail


def _read_whole(fd, size):
    """The whole file, if it is small enough to be an installer's (else None: not one)."""
    return os.pread(fd, size, 0) if size <= MAX_PROVEN_BYTES else None


def _pth_files(path, head):
    """The files a ``.pth`` file's path lines put on Python's path: only a zip can be imported from a file, so each
    is code Python may import at every start."""
    folder, found = os.path.dirname(path), []
    for line in (head or b"").decode("utf-8", "replace").splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "import ", "import\t")):
            continue
        target = os.path.join(folder, line)
        if os.path.isfile(target):
            found.append(target)
    return found[:20]


def _is_runner_file(path):
    """A file of a Python test runner's own package (pytest's), or its program: the runner has started."""
    return "/_pytest/" in path or path.endswith("/pytest/__init__.py") or os.path.basename(path) in ("pytest",
                                                                                                       "py.test")


def _start_time(pid):
    try:
        return int(_stat_fields(pid)[_STARTTIME])
    except (OSError, ValueError, IndexError):
        return None


def _mount_points(pid):
    """The mount points of the process's mount namespace, as paths inside it."""
    points = []
    with open("/proc/{}/mountinfo".format(pid)) as handle:
        for line in handle:
            point = line.split()[4]
            points.append(point.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n"))
    return points
