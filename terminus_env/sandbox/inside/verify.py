"""The verifier's run (op ``verify``): fresh private folders, the verifier in its own namespaces with the root folder
held still (FrozenRoot) and what it opens watched (watch.py), then the files it wrote and the limits the container
hit meanwhile."""

import base64
import contextlib
import fcntl
import io
import os
import re
import stat
import struct
import tarfile
import time

from .links import agents_links
from .plugins import HiddenPlugins
from .private_folders import NotRegular, _b64, _empty_dir
from .watch import OpenWatch

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
    stages = Stages()
    before = limit_counters()
    verifier_root = "/proc/{}/root".format(daemon.verifier_init)
    for folder in daemon.private.values():
        folder.check()
        folder.check(verifier_root)
        folder.empty()
    tests = base64.b64decode(req["tests"])
    if tests:
        daemon.private["/tests"].unpack(tests)
    stages.mark("folders")
    clear_bytecode(req.get("bytecode", ()), daemon.since)
    links = agents_links(daemon.since, req.get("links", ()))
    stages.mark("bytecode_links")
    with contextlib.ExitStack() as cleanup:  # undone in reverse, whatever fails
        changed = req.get("changed")  # None: too many to say, so nothing of the container's caches is reused
        caches = FreshCaches(req.get("env") or {}, None if changed is None else frozenset(changed))
        cleanup.callback(caches.remove)
        env = dict(caches.environment, **(req.get("env") or {}))
        harbor = req.get("harbor_verdict", False)  # evaluation: the run as Harbor's, what training refuses listed
        hidden = HiddenPlugins(daemon, () if harbor else req.get("plugins", ()))
        cleanup.callback(hidden.remove)
        frozen = FrozenRoot()
        cleanup.callback(frozen.thaw)
        watch = OpenWatch(daemon, window, links, expects_tests(tests), refuse_untrusted=not harbor)
        cleanup.callback(watch.close)
        stages.mark("watch_setup")
        result = daemon.run(
            ["bash", "-c", req["cmd"]], "verifier", req["timeout"], user=req.get("user"), env=env,
            cwd=req.get("workdir"), max_output=req.get("max_output", 100000), tick=watch.drain, wake=watch.fds,
        )  # fmt: skip
        stages.mark("run")
        daemon.stop_verifier_leftovers(tick=watch.drain)
        stages.mark("leftovers")
        watched = watch.finish(daemon, req.get("workdir") or "/")
        stages.mark("watch_finish")
        watched["links"] = links
        watch.check_rewards(daemon.private["/logs/verifier"].fd)
        watched["watch"]["runner_signal"] = result.pop("signal")
    stages.mark("cleanup")
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
    stages.mark("read")
    result.update(watched)
    result["stages"] = stages.spent
    return result


class Stages:
    """Seconds each stage of a verifier run took, in order (the host prints them: where grading's time goes)."""

    def __init__(self):
        self.last = time.monotonic()
        self.spent = {}

    def mark(self, name):
        now = time.monotonic()
        self.spent[name] = now - self.last
        self.last = now


TEST_RUNNER_WORDS = (b"pytest", b"py.test")
MAX_SCANNED_BYTES = 1 << 20


def expects_tests(archive):
    """Whether the verifier's tests (the tar the host sent) hold Python files or name a Python test runner: then a
    run that never opened a test file never reached its tests. Only scripts that name no runner are tests of their
    own. The tests are the task author's, never the agent's."""
    if not archive:
        return False
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tests:
        for member in tests.getmembers():
            if not member.isfile():
                continue
            if member.name.endswith(".py"):
                return True
            if member.size <= MAX_SCANNED_BYTES:
                data = tests.extractfile(member).read()
                if any(word in data for word in TEST_RUNNER_WORDS):
                    return True
    return False


CACHE_PARENT = "/tmp"


def clear_bytecode(paths, since):
    """Remove, of ``paths`` (what the layer lists under __pycache__), the bytecode the agent's side wrote for a source
    unchanged in this container, or for any source in a site or standard-library folder: any Python the agent runs
    writes bytecode beside the modules it imports (official python images ship none), and the verifier's Python
    would load it as the module. The verifier's Python compiles those sources again, from the files themselves (an
    installer's module proved by its content included). The bytecode of the task's own files elsewhere (its
    project) stays: it is the task's state."""
    for path in paths:
        folder, name = os.path.split(path)
        if os.path.basename(folder) != "__pycache__" or not name.endswith(".pyc"):
            continue
        source = os.path.join(os.path.dirname(folder), name.split(".")[0] + ".py")
        try:
            cached = os.lstat(path)
            if not stat.S_ISREG(cached.st_mode) or cached.st_ctime < since:
                continue
            if not _RUNTIME_SOURCE.match(source) and os.lstat(source).st_ctime >= since:
                continue
            os.unlink(path)
        except OSError:
            continue


_RUNTIME_SOURCE = re.compile(r"(.*/(site|dist)-packages/|(/usr|/usr/local)?/lib/python3[.\d]*/).*")


class FreshCaches:
    """Caches of the verifier's package managers of its own, one folder per run. uv links what it installs from its
    cache, and pip and uv install what a cache holds: with the container's caches, the verifier's own environment
    would be made of files the agent wrote (or changed, by that very link). A task that sets these variables itself
    keeps its own.

    uv's cache starts from the image's, as the image was built (an offline image fills it so that its verifier runs
    without the network): each folder or file of it that the agent's side did not change (``changed``: the paths
    Docker's diff or the layer's walk listed, with every folder above them) is linked in, what the agent changed is
    left out, and uv copies from the cache rather than linking (a link would change the image's files). Nothing here
    is trusted more for being fresh: the watch still judges every file by who wrote it."""

    VARIABLES = {"UV_CACHE_DIR": "uv", "PIP_CACHE_DIR": "pip"}
    MAX_SEEDED = 100000  # links made into a seeded cache at most: past it, the rest of the image's cache is left out

    def __init__(self, task_env=None, changed=None):
        self.path = None
        self.environment = {}
        task_env = task_env or {}
        try:
            path = os.path.join(CACHE_PARENT, ".terminus-verifier-" + os.urandom(8).hex())
            os.mkdir(path)
            self.path = path
            os.chmod(path, 0o777)  # whatever user the verifier runs as (no name is resolved here: see credentials)
        except OSError:
            return  # no /tmp: the verifier runs with its own settings
        self.environment = {name: os.path.join(self.path, sub) for name, sub in self.VARIABLES.items()
                            if name not in task_env}  # fmt: skip
        if "UV_CACHE_DIR" in self.environment:
            if "UV_LINK_MODE" not in task_env:
                self.environment["UV_LINK_MODE"] = "copy"
            image_cache = os.environ.get("UV_CACHE_DIR") or os.path.join(
                os.environ.get("XDG_CACHE_HOME") or "/root/.cache", "uv")
            if changed is not None:
                _seed(image_cache, self.environment["UV_CACHE_DIR"], changed, self.MAX_SEEDED)

    def remove(self):
        if self.path is None:
            return
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                _empty_dir(fd)
            finally:
                os.close(fd)
            os.rmdir(self.path)
        except OSError:
            pass


def _seed(source, target, changed, budget):
    """Link into ``target`` every folder and file of the cache ``source`` that the agent's side did not change: a
    folder with no change below it as a whole, a changed folder entry by entry. Returns how many links were made."""
    try:
        if not stat.S_ISDIR(os.lstat(source).st_mode):
            return 0  # none, or a link: not a cache the image was built with
    except OSError:
        return 0
    made = 0
    stack = [(source, target)]
    while stack and made < budget:
        folder, into = stack.pop()
        try:
            os.mkdir(into)
            os.chmod(into, 0o777)  # the verifier's uv adds entries, whatever user it runs as
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            if name == ".lock" or made >= budget:
                continue
            path = os.path.join(folder, name)
            if path in changed and not os.path.isdir(path):
                continue  # the agent's file
            if path in changed:
                if not _is_link(path):
                    stack.append((path, os.path.join(into, name)))  # a folder with changes below: entry by entry
                continue
            try:
                os.symlink(path, os.path.join(into, name))
                made += 1
            except OSError:
                continue
    return made


def _is_link(path):
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        return True


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
