"""What the verifier ran (OpenWatch): fanotify on the verifier's and the agent's mounts while the verifier runs, who
opened the reward, and the links changed in this container whose targets it opened."""

import ctypes
import errno
import os
import stat
import time

from .code_files import CODE_MAGIC, CODE_SUFFIXES, names_what_runs
from .exec_witness import ExecWitness
from .installer_files import installer_hook_candidate, proven_installer_file
from .kernel import FAN_ALLOW, FAN_DENY, FANOTIFY_EVENT, FANOTIFY_RESPONSE, _libc
from .links import links_opened
from .names import RUN_DIR, TESTS_FOLDER
from .opened_files import (
    fd_path,
    is_code,
    is_zip,
    pth_files,
    read_whole,
    unrecorded_target,
)
from .packages import packaged_candidate, sha256_of
from .private_folders import _b64
from .processes import identity_of
from .tests_start import StartOfTests

FAN_CLOEXEC, FAN_NONBLOCK, FAN_UNLIMITED_QUEUE, FAN_MARK_ADD, FAN_MARK_MOUNT = 0x1, 0x2, 0x10, 0x1, 0x10
FAN_CLASS_CONTENT = 0x4
FAN_CLOSE_WRITE, FAN_OPEN, FAN_Q_OVERFLOW, FAN_OPEN_EXEC, FAN_OPEN_PERM = 0x8, 0x20, 0x4000, 0x1000, 0x10000
FAN_OPEN_EXEC_PERM = 0x40000

REWARD_FOLDER = "/logs/verifier"
REWARD_FILES = ("reward.txt", "reward.json")
# No file there can be code the agent provided: kernel views, terminals, message queues, the host's folder, the
# reward's (asked about apart). /dev itself (a tmpfs root may write) and the verifier's own /dev/shm are watched.
_UNWATCHED = ("/proc", "/sys", "/dev/pts", "/dev/mqueue", RUN_DIR, REWARD_FOLDER)
MAX_HELD = 4096  # files the agent's side or its code wrote, kept open while the verifier runs (see OpenWatch._hold)
MAX_WATCHED_FILES = 200000  # files recorded: code, what names what runs, the agent's links' targets (data is not)
MAX_LOST_LISTED = 5  # reasons kept of the events the watch could not record
MAX_EARLY_CODE = 20000  # code files opened before the tests began, listed for the rules (a link may lead there)
GROUP_WAIT_S = 60.0  # how long a verifier waits for a fanotify group when the host's are all in use
HEAD_BYTES = 4096  # of a changed .pth or entry_points.txt file: its lines decide what runs
_READ_HEADS = (".pth", "/entry_points.txt")
MAX_LISTED = 2000  # libraries the verifier loaded, listed for the rules


class OpenWatch:
    """Every file the verifier's processes open or execute while it runs, every file either side writes, and who
    opens the reward.

    Four fanotify groups. Two only take notice (nothing is blocked): one on every mount of the verifier's
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
    process ran is known before it asks. The fourth holds each exec until its process's identity is recorded
    (``ExecWitness``): who wrote a file does not depend on how late its event is read."""

    def __init__(self, daemon, window, links=(), expects_tests=True, refuse_untrusted=True):
        self.daemon = daemon
        # Training refuses an untrusted process the reward; evaluation lets it write, as Harbor does, and reports it.
        self.refuse_untrusted = refuse_untrusted
        self.groups = []
        self.window = window  # when the verifier's run began
        self.opened = {}  # (dev, ino) -> record
        # Written by the agent's side, by the verifier's processes, and by those of them that ran the agent's code
        # (whatever such a process writes is the agent's: a wheel it unpacked, a module it rewrote).
        self.written = {"verifier": set(), "agent": set(), "tainted": set()}
        self.complete = True
        self.order = 0  # events recorded so far: a file's first open is told apart from the first test file's
        self.tests_device = os.fstat(daemon.private[TESTS_FOLDER].fd).st_dev
        self.links = list(links)  # where the agent's links lead
        self.start = StartOfTests(self.links, expects_tests)
        self.ran_agents_code = {}  # (pid, start time) -> the changed code files it opened (the agent's, unless its own)
        self.untrusted_files = {}  # (dev, ino) in /logs/verifier -> why no opener of it is trusted
        self.untrusted_rewards = []
        self.reported_rewards = set()  # (dev, ino) of the reward files an untrusted process opened by their name
        self.lost = []  # why events could not be recorded (the first MAX_LOST_LISTED)
        self.execs = None  # who started whom, seen at each exec (None: the kernel has no exec permission events)
        self.held = {}  # (dev, ino) -> a descriptor kept open so that the number is not reused (see _hold)
        self.data_opened = 0  # opens of data that decides nothing, not recorded (see _may_decide)
        try:
            verifier_mask = FAN_OPEN | FAN_OPEN_EXEC | FAN_CLOSE_WRITE
            self.groups.append(("verifier", self._group(daemon.roots["verifier"], verifier_mask)))
            self.groups.append(("agent", self._group(daemon.roots["agent"], FAN_CLOSE_WRITE)))
            self.groups.append(("reward", self._group(daemon.roots["verifier"], FAN_OPEN_PERM, only=REWARD_FOLDER)))
            self.execs = self._exec_witness(daemon)
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
        blocking = mask & (FAN_OPEN_PERM | FAN_OPEN_EXEC_PERM)
        flags = FAN_CLOEXEC | FAN_NONBLOCK | FAN_UNLIMITED_QUEUE | (FAN_CLASS_CONTENT if blocking else 0)
        deadline = time.monotonic() + GROUP_WAIT_S
        while True:
            fd = init_fn(flags, os.O_RDONLY | os.O_LARGEFILE | os.O_CLOEXEC)
            code = ctypes.get_errno()
            if fd >= 0 or code != errno.EMFILE or time.monotonic() > deadline:
                break
            time.sleep(0.2)  # every verifier on this host holds four groups: wait for one to finish
        if fd < 0 and code == errno.EMFILE:
            raise OSError(code, "fanotify_init: every fanotify group of the host's root is in use (each running "
                                "verifier holds four): raise it on the sandbox host, e.g. `sysctl -w "
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

    def _exec_witness(self, daemon):
        """The fourth group: every exec on the verifier's mounts waits until its process's identity is recorded."""
        try:
            group = self._group(daemon.roots["verifier"], FAN_OPEN_EXEC_PERM)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            return None  # Linux < 5.0: identities are read live only, and fail closed once gone
        try:
            witness = ExecWitness(group, daemon)
        except RuntimeError:  # no thread: the agent's processes hold every pid, so the verifier cannot start either
            os.close(group)
            return None
        self.exec_group = group
        return witness

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
            while offset + FANOTIFY_EVENT.size <= len(data):
                length, _, _, _, mask, fd, pid = FANOTIFY_EVENT.unpack_from(data, offset)
                offset += max(length, FANOTIFY_EVENT.size)
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
                self._hold(key, fd)
            elif side == "agent":
                self._hold(key, fd)
        if side != "verifier" or not mask & (FAN_OPEN | FAN_OPEN_EXEC):
            return
        self.order += 1
        written = self.written
        changed = info.st_ctime >= self.daemon.since or key in written["agent"] or key in written["tainted"]
        record = self.opened.get(key)
        if record is None:
            path = fd_path(fd, info)
            in_tests = info.st_dev == self.tests_device  # the verifier's own tests, known by their mount
            verifiers = key in written["verifier"]
            self.start.see(self.order, path, in_tests, verifiers, image_unchanged=not changed and not verifiers)
            if in_tests:  # the verifier's own, fresh each run
                return
            if not self._may_decide(path, key, changed, mask, fd, info.st_size):
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
        if changed and record.get("zip") is None:  # only what the agent may have provided is looked at so closely
            record["zip"] = is_zip(fd, info.st_size)
            if installer_hook_candidate(record["path"]):
                record["proven"] = proven_installer_file(record["path"], read_whole(fd, info.st_size))
            if record["path"].endswith(".pth"):
                record["pth_files"] = pth_files(record["path"], record["head"])
        if "sha256" not in record and changed and is_code(record) and packaged_candidate(record["path"]):
            record["sha256"] = sha256_of(fd, info.st_size)  # as loaded: the host may prove it a package's own
        if is_code(record) and changed and not record.get("proven"):
            identity = self._identity(pid)
            if identity is not None:  # unknown: its writes are untraced, so the agent's (fail closed)
                self.ran_agents_code.setdefault((pid, identity[0]), []).append(key)

    def _hold(self, key, fd):
        """Keep a file the agent's side or its code wrote open until the run ends: a file is known by its inode
        number, which a deleted file gives back for the next one made, and the verifier's own next file (a module
        it unpacks where the agent's code left a temporary file) must not inherit the agent's. Past MAX_HELD, a
        reused number makes a file the agent's: a false flag, never a missed one."""
        if key in self.held or len(self.held) >= MAX_HELD:
            return
        try:
            self.held[key] = os.dup(fd)
        except OSError:  # out of descriptors: as past MAX_HELD
            pass

    def _may_decide(self, path, key, changed, mask, fd, size):
        """Whether a file the verifier opened can decide anything the rules judge, so is recorded: code (by how it
        was opened, its name or its first bytes), a zip the agent's side may have made, a file whose name or place
        decides what runs, a target of the agent's links, or a file the agent's side wrote while the verifier ran.
        Other data, the image's or the agent's (a test reading thousands of output files), decides nothing: it is
        counted, not recorded, and is asked again at its next open (it may have changed meanwhile)."""
        if mask & FAN_OPEN_EXEC or path.endswith(CODE_SUFFIXES) or names_what_runs(path):
            return True
        if self.start.via_link(path) or key in self.written["agent"]:
            return True
        if os.pread(fd, 4, 0).startswith(CODE_MAGIC):
            return True
        return changed and self._agents(key) and is_zip(fd, size)

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
        code the agent provided, ("orphan", why) when it left the test script's tree, ("untraced", why) when neither
        /proc nor what was recorded at the processes' execs can tell, (None, None) when it is the test script's own.
        A process gone already is known by what its exec left (``ExecWitness``), so the answer does not depend on
        how late the event is read."""
        untraced = ("untraced", "could not be traced to the test script")
        current = pid
        for _ in range(4096):
            identity = self._identity(current)
            if identity is None:
                return untraced
            start, parent = identity
            ran = next((key for key in self.ran_agents_code.get((current, start), ()) if self._agents(key)), None)
            if ran is not None:
                path = self.opened[ran]["path"] if ran in self.opened else "a file"
                return "ran", (
                    "ran {}, which the agent provided".format(path)
                    if current == pid
                    else "descends from pid {}, which ran {}, which the agent provided".format(current, path)
                )
            if parent == self.daemon.verifier_init:
                return "orphan", "outlived its parent: it belongs to no test script"
            outside = self._outside_verifier(parent)
            if outside is None:
                return untraced
            if outside:
                return None, None  # started by the daemon: the test script itself
            current = parent
        return untraced

    def _identity(self, pid):
        """(start time, parent pid): from /proc while the process lives, else as its exec left it, else None. A
        process being reaped still has its /proc entry, with parent 0: that is not a parent."""
        try:
            start, parent = identity_of(pid)
            if parent > 0:
                return start, parent
        except (OSError, ValueError, IndexError):
            pass
        return None if self.execs is None else self.execs.seen(pid)

    def _outside_verifier(self, pid):
        """Whether ``pid`` is outside the verifier's processes, on the daemon's side (None: gone and never seen at
        an exec, so it cannot be told). Told by its namespace's depth, which /proc shows for any live process,
        undumpable or not."""
        if self.daemon.in_verifier_namespace(pid):
            return False
        try:
            if identity_of(pid)[1] > 0:  # alive (being reaped, it names parent 0 and no namespace)
                return True  # and not the verifier's: a verifier process's parent is the verifier's or the daemon's
        except (OSError, ValueError, IndexError):
            pass
        return False if self.execs is not None and self.execs.seen(pid) is not None else None

    def _answer(self, group, fd, pid):
        """Allow or refuse an open in /logs/verifier; refused: a reward file opened by a process not to be trusted,
        and any open the daemon cannot judge (the question is always answered: an unanswered opener would hang)."""
        refuse = True
        try:
            self.drain_notices()
            why = self.untrusted(pid)
            info = os.fstat(fd)
            path = fd_path(fd, info)
            untrusted = why is not None and os.path.basename(path) in REWARD_FILES
            refuse = untrusted and self.refuse_untrusted
            if why is not None:
                self.untrusted_files[(info.st_dev, info.st_ino)] = "pid {} (which {})".format(pid, why)
            if untrusted:
                self.untrusted_rewards.append({"path": path, "pid": pid, "why": why, "refused": refuse})
                self.reported_rewards.add((info.st_dev, info.st_ino))
        finally:
            os.write(group, FANOTIFY_RESPONSE.pack(fd, FAN_DENY if refuse else FAN_ALLOW))

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
                self.untrusted_rewards.append(
                    {
                        "path": "{}/{}".format(REWARD_FOLDER, name),
                        "pid": 0,
                        "why": "this file became the reward, but {} opened it".format(why),
                        "refused": self.refuse_untrusted,
                    }
                )

    def finish(self, daemon, workdir):
        """Once the verifier's processes are gone: read the last events and say what it ran that changed (``during``:
        changed since the start of the verifier's run, by another than the verifier; ``early``: first opened before
        the tests began), the code it opened before the tests began, the links changed in this container whose
        targets it opened, the libraries it loaded, and the refused openers of the reward."""
        self.drain()
        window = self.window
        for record in self.opened.values():
            record["early"] = self.start.early(record["path"], record["first"])
        used = []
        for key, record in self.opened.items():
            changed = record["ctime"] >= daemon.since or key in self.written["agent"] or key in self.written["tainted"]
            if changed and self._agents(key):
                head = record["head"] or b""
                during = record["ctime"] >= window or key in self.written["agent"]
                wide = record["path"].endswith(_READ_HEADS) or during
                used.append(
                    {
                        "path": record["path"],
                        "exec": record["exec"],
                        "magic": head[:4].hex(),
                        "head": _b64(head) if wide else None,
                        "during": during,
                        "early": record["early"],
                        "zip": bool(record.get("zip")),
                        "proven": bool(record.get("proven")),
                        "pth_files": record.get("pth_files", []),
                        "sha256": record.get("sha256"),
                    }
                )
        early_code = sorted(record["path"] for record in self.opened.values() if record["early"] and is_code(record))
        if len(early_code) > MAX_EARLY_CODE:
            self.complete = False
        targets = {record["path"]: record for record in self.opened.values()}
        loaded = sorted(
            record["path"]
            for record in self.opened.values()
            if not record["exec"] and (record["head"] or b"")[:4] == b"\x7fELF"
        )[:MAX_LISTED]
        # A link made while the verifier ran may lead to data that was not recorded: fail closed, as if opened early.
        unrecorded = unrecorded_target if self.data_opened else None
        relinked = links_opened(daemon.since, self.window, targets, workdir, self.links, unrecorded)
        return {"used": used, "relinked": relinked, "loaded": loaded,
                "watch": {"complete": self.complete, "lost": self.lost, "early_code": early_code[:MAX_EARLY_CODE],
                          "untrusted_rewards": self.untrusted_rewards}}  # fmt: skip

    def close(self):
        if self.execs is not None:
            self.execs.close()
            os.close(self.exec_group)
            self.execs = None
        for fd in self.held.values():
            os.close(fd)
        self.held = {}
        for _, fd in self.groups:  # a permission event not yet answered is allowed when its group closes
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
