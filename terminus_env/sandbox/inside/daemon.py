"""Part 2, on the host's side: the control daemon. The main process forks it once the container is split; it takes
the host's channel (channel.py), serves the host's requests (ops.py) on a fixed pool of threads until the host
hangs up, then stops the container. Its state (Daemon) starts every process the requests need."""

import ctypes
import errno
import json
import linecache  # noqa: F401 - loaded now: tracebacks read source lines, and no import may happen later
import os
import queue
import select
import signal
import sys
import threading
import time
import traceback
import warnings

from .channel import send, take_channel
from .kernel import PR_SET_DUMPABLE, PR_SET_NAME, _libc, prctl
from .names import CHANNEL_DIR, CHANNEL_SOCKET, DIRECT, SPLIT_REPORT
from .ops import OPS
from .private_folders import VERIFIER_FOLDERS, AgentFault, PrivateFolder
from .processes import (
    AGENT_STAGES,
    CappedBuffer,
    Spawner,
    SpawnError,
    _pids,
    _zombie,
    freeze_then_kill,
    stream_pair,
)
from .seccomp import seccomp_program
from .tmux import Tmux
from .watch import _mount_points

WORKERS = 8  # request threads, started up front: a fork bomb may leave no pid for a new one
CHANNEL_WAIT_S = 30.0  # how long the daemon waits for the host before it stops the container
# ctime is kept in coarse clock ticks (at most 10 ms behind the clock): what changed a tick before the daemon read the
# clock counts too. No more: the files of an image built just before its container started (a task's first episode
# after its build) would count as changed in this container, and the verifier's tools read as the agent's.
CHANGE_MARGIN_S = 0.1


class Daemon:
    """The daemon's state: how to start processes, the two inits, the host's private folders, the terminal's tmux
    clients, and since when a file counts as changed in this container."""

    def __init__(self, agent_init, verifier_init, file_limit=0):
        self.agent_init = agent_init
        self.verifier_init = verifier_init
        self.verifier_level = len(_ns_pids(verifier_init))  # the depth of the verifier's PID namespace
        programs = dict.fromkeys(("agent", "terminal"), seccomp_program())
        programs["verifier"] = seccomp_program(untraceable=True)
        self.spawner = Spawner(agent_init, verifier_init, programs, file_limit)
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

    def run(self, argv, side, timeout, user=None, env=None, cwd=None, max_output=1000000, tick=None, wake=()):
        """Run argv to its end (or the timeout, which kills what it started); collect its output, capped. ``tick``
        is called on this thread (a fork bomb may leave no pid for another) as soon as one of the ``wake``
        descriptors is readable, and every few milliseconds besides. ``signal``: the signal that ended argv, when
        this did not send it (the timeout)."""
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
                open_ = _drain(read_end if open_ else None, buffer, min(left, 0.05), wake)
                if tick is not None:
                    tick()
            # Background children may hold the pipe open; stop reading shortly after the command is done.
            end = time.monotonic() + 1.0
            while open_ and time.monotonic() < end:
                open_ = _drain(read_end, buffer, end - time.monotonic(), wake)
                if tick is not None:
                    tick()
        finally:
            os.close(read_end)
        return {
            "exit_code": 124 if timed_out else child.code,
            "timed_out": timed_out,
            "signal": None if timed_out else child.signal,
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

    def stop_verifier_leftovers(self, rounds=500, tick=None):
        """Kill everything in the verifier's PID namespace but its init, so nothing the verifier started outlives it
        (a leftover could rewrite the reward once the verifier ended). The agent's processes live a level below.
        Members are frozen first, as in kill_tree, so a fork bomb cannot outrun the killing. ``tick`` answers the
        watch's questions meanwhile: a process waiting for an answer cannot be stopped, only killed."""
        for _ in range(rounds):
            if tick is not None:
                tick()
            alive = [pid for pid in _pids() if pid != self.verifier_init and self.in_verifier_namespace(pid)
                     and not _zombie(pid)]  # fmt: skip
            if not alive:
                return
            freeze_then_kill(alive)
            time.sleep(0.005)

    def in_verifier_namespace(self, pid):
        """Whether ``pid`` lives in the verifier's PID namespace, from its depth (/proc/<pid>/status, which shows
        any process's, undumpable or not; its namespace's link does not): the verifier's is the only namespace at
        its depth (the agent's lies below it, and nothing in the container may make another). False once gone."""
        levels = _ns_pids(pid)
        return bool(levels) and len(levels) == self.verifier_level

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


def _drain(fd, buffer, wait_s, wake=()):
    """Read what ``fd`` has within ``wait_s`` (or until one of ``wake`` is readable); False at end of file, and
    False when ``fd`` is None (closed already)."""
    ready, _, _ = select.select(([fd] if fd is not None else []) + list(wake), [], [], max(wait_s, 0))
    if fd is None or fd not in ready:
        return fd is not None
    chunk = os.read(fd, 65536)
    buffer.add(chunk)
    return bool(chunk)


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
