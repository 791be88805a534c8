"""The pytest plugins the agent registered, out of the verifier's sight while it runs.

pytest loads every plugin registered under an ``entry_points.txt``'s ``[pytest11]`` group before its tests begin, so a
registration is the runner's configuration, and the agent's may not choose it: a cheat's plugin forces a pass, and an
honest install looks the same (``pip install httpx`` registers anyio's). So, in the verifier's mount namespace only,
each ``entry_points.txt`` the agent's side wrote that registers one is covered, for the run, by a read-only copy
without that group (its other groups stay: console scripts, the package's own). Nothing is judged: the registration
is simply not there. A test suite that needs a plugin the agent installed fails as it would without the plugin.
"""

import os

from .kernel import CLONE_NEWNS, CLONE_NEWPID, MS_BIND, _libc, mount, setns
from .names import RUN_DIR
from .processes import _exit_code

PLUGIN_GROUP = "pytest11"
MAX_ENTRY_POINTS_BYTES = 65536  # an entry_points.txt larger than this is left as it is (and judged if read early)
MAX_HIDDEN = 64
MNT_DETACH = 2
_COPIES = RUN_DIR + "/hidden-entry-points"


def without_plugins(text):
    """``entry_points.txt`` without its ``[pytest11]`` group; None if it has none. A section's name is read with
    spaces around it dropped, as the most lenient of its readers (pkg_resources) reads it."""
    kept, dropping, dropped = [], False, False
    for line in text.splitlines(True):
        stripped = line.strip()
        if stripped.startswith("[") and stripped.endswith("]"):
            dropping = stripped[1:-1].strip() == PLUGIN_GROUP
            dropped = dropped or dropping
        if not dropping:
            kept.append(line)
    return "".join(kept) if dropped else None


class HiddenPlugins:
    """The covers laid over the agent's plugin registrations for one verifier run; ``remove`` lifts them."""

    def __init__(self, daemon, paths):
        self.daemon = daemon
        self.covered = []  # (copy, path) pairs
        for path in sorted(set(paths))[:MAX_HIDDEN]:
            cover = self._copy_without_plugins(path, len(self.covered))
            if cover is not None:
                self.covered.append(cover)
        if self.covered:
            self._in_verifier_mounts(_cover, self.covered)

    def _copy_without_plugins(self, path, index):
        if not path.endswith("/entry_points.txt") or os.path.realpath(path) != path:
            return None  # reached through a link: not a registration a package manager wrote
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            info = os.fstat(fd)
            if not (info.st_mode & 0o170000 == 0o100000) or info.st_size > MAX_ENTRY_POINTS_BYTES:
                return None
            text = os.pread(fd, MAX_ENTRY_POINTS_BYTES, 0).decode("utf-8", "replace")
        finally:
            os.close(fd)
        kept = without_plugins(text)
        if kept is None:
            return None
        os.makedirs(_COPIES, mode=0o755, exist_ok=True)
        copy = "{}/{}".format(_COPIES, index)
        with open(copy, "w") as handle:
            handle.write(kept)
        os.chmod(copy, 0o444)
        return copy, path, (info.st_dev, info.st_ino)

    def remove(self):
        if self.covered:
            try:
                self._in_verifier_mounts(_uncover, self.covered)
            finally:
                for copy, _, _ in self.covered:
                    try:
                        os.unlink(copy)
                    except OSError:
                        pass
                self.covered = []

    def _in_verifier_mounts(self, work, covered):
        """Run ``work(covered)`` in a process inside the verifier's mount and PID namespaces (a threaded process cannot
        enter a mount namespace, and the verifier's /proc knows only its own PID namespace's processes)."""
        ns = [os.open("/proc/{}/ns/{}".format(self.daemon.verifier_init, kind), os.O_RDONLY | os.O_CLOEXEC)
              for kind in ("mnt", "pid")]  # fmt: skip
        try:
            pid = os.fork()
            if pid == 0:  # only raw calls from here, never return into the daemon
                code = 1
                try:
                    setns(ns[0], CLONE_NEWNS)
                    setns(ns[1], CLONE_NEWPID)
                    inner = os.fork()
                    if inner == 0:
                        inner_code = 1
                        try:
                            work(covered)
                            inner_code = 0
                        finally:
                            os._exit(inner_code)
                    code = _exit_code(os.waitpid(inner, 0)[1])
                finally:
                    os._exit(code)
        finally:
            for fd in ns:
                os.close(fd)
        if _exit_code(os.waitpid(pid, 0)[1]) != 0:
            raise OSError("could not {} the agent's pytest plugins in the verifier's view".format(
                "cover" if work is _cover else "uncover"))  # fmt: skip


def _cover(covered):
    """Bind each copy over its file, found through a descriptor (a folder swapped meanwhile cannot redirect the
    mount). The copies lie on the host side's folder, read-only in the verifier's namespace, and so are the binds."""
    for copy, path, identity in covered:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            info = os.fstat(fd)
            if (info.st_dev, info.st_ino) == identity:  # else changed since it was read: judged if the runner reads it
                mount(copy, "/proc/self/fd/{}".format(fd), None, MS_BIND)
        finally:
            os.close(fd)


def _uncover(covered):
    for _, path, _ in covered:
        _libc.umount2(path.encode(), MNT_DETACH)
