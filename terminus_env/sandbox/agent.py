"""The control agent that runs INSIDE a sandbox container (stdlib only, Python >= 3.6).

The host starts it once per container with one long-lived ``docker exec`` and talks to it
over the exec's stdin/stdout: one JSON object per line each way, matched by ``id``. Every
tmux operation and one-shot command then costs a round trip on that channel (a few ms)
instead of a new ``docker exec`` (about 75 ms). Each request runs in its own thread, so a
long ``exec`` or a terminal wait does not hold up other requests.

When its stdin closes, the owner process is gone (even after SIGKILL the kernel closes its
socket), so the agent stops the container's main process and the container removes itself.

The host sends this file's source as the first line on stdin to a small ``python3 -c`` bootstrap;
it must not import anything from terminus_env.
"""

import base64
import fcntl
import grp
import json
import os
import pwd
import queue
import signal
import struct
import subprocess
import sys
import threading
import time

FIONREAD = 0x541B
TIOCOUTQ = 0x5411
POLL_S = 0.002


def credentials(user):
    """(uid, gid, groups, home, name) for 'name', 'uid', 'name:group' or 'uid:gid'; None for the agent's own."""
    if not user:
        return None
    name, _, group = user.partition(":")
    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except KeyError:
        if not name.isdigit():
            raise ValueError(f"no user {name!r} in the container") from None
        entry = None
    uid = entry.pw_uid if entry else int(name)
    if group:
        gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
    else:
        gid = entry.pw_gid if entry else uid
    groups = os.getgrouplist(entry.pw_name, gid) if entry else [gid]
    home = entry.pw_dir if entry else "/"
    return uid, gid, groups, home, entry.pw_name if entry else str(uid)


def spawn_options(user, env):
    """Popen keyword arguments that run a child as ``user`` with ``env`` added to ours."""
    env = dict(os.environ, **(env or {}))
    creds = credentials(user)
    if creds is None:
        return {"env": env}
    uid, gid, groups, home, name = creds
    env.update(HOME=home, USER=name, LOGNAME=name)
    if sys.version_info >= (3, 9):  # noqa: UP036 - containers may hold an older python3; thread-safe path
        return {"env": env, "user": uid, "group": gid, "extra_groups": groups}

    def demote():
        os.setgroups(groups)
        os.setgid(gid)
        os.setuid(uid)

    return {"env": env, "preexec_fn": demote}


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


def descendants(root):
    """Pids of every process below ``root``, found through /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(proc):
    pids = descendants(proc.pid)
    for target in [proc.pid] + pids:
        try:
            os.kill(target, signal.SIGKILL)
        except OSError:
            pass
    for _ in range(20):  # a fork bomb may add members while we kill; repeat until the group is empty
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            break
        time.sleep(0.01)


def op_exec(req):
    options = spawn_options(req.get("user"), req.get("env"))
    buffer = CappedBuffer(int(req.get("max_output", 1000000)))
    start = time.monotonic()
    proc = subprocess.Popen(
        ["bash", "-c", req["cmd"]],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=req.get("workdir") or None,
        start_new_session=True,
        **options,
    )

    def pump():
        for chunk in iter(lambda: os.read(proc.stdout.fileno(), 65536), b""):
            buffer.add(chunk)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout=float(req["timeout"]))
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_tree(proc)
        proc.wait()
    # Background children may hold the pipe open; stop reading shortly after bash is done.
    reader.join(timeout=1.0)
    code = proc.returncode
    return {
        "exit_code": 124 if timed_out else (128 - code if code < 0 else code),
        "timed_out": timed_out,
        "head": buffer.head.decode("utf-8", "replace"),
        "tail": buffer.tail.decode("utf-8", "replace"),
        "omitted": buffer.omitted,
        "duration_s": time.monotonic() - start,
    }


def run_tmux(argv, user):
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **spawn_options(user, None)
    )
    out, err = proc.communicate()
    return proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def op_tmux(req):
    code, out, err = run_tmux(req["argv"], req.get("user"))
    return {"rc": code, "out": out, "err": err}


def control_quote(arg):
    """A double-quoted argument for tmux's command parser (used by control mode)."""
    out = ['"']
    for ch in arg:
        if ch in '\\"$':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(f"\\{ord(ch):03o}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


class ControlClient:
    """A tmux control-mode client kept attached, so a tmux command costs a line on a pipe, not a fork.

    Each command answers with a %begin/%end (or %error) block; notifications outside blocks
    are skipped, and pane output notifications are switched off.
    """

    def __init__(self, tmux, target, user):
        self.proc = subprocess.Popen(
            tmux + ["-C", "attach-session", "-t", target],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            **spawn_options(user, None),
        )
        self.lock = threading.Lock()
        self.blocks = queue.Queue()
        threading.Thread(target=self.read_blocks, daemon=True).start()
        self.run([["refresh-client", "-f", "no-output"]])

    def read_blocks(self):
        current, begin = None, None
        for raw in self.proc.stdout:
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
        self.blocks.put(None)

    def run(self, commands):
        """(ok, output) of a list of commands run as one tmux command list (atomically)."""
        line = " ; ".join(" ".join(control_quote(arg) for arg in command) for command in commands)
        with self.lock:
            self.proc.stdin.write(line.encode("utf-8", "surrogateescape") + b"\n")
            self.proc.stdin.flush()
            output, ok = [], True
            for _ in commands:
                block = self.blocks.get(timeout=30)
                if block is None:
                    raise EOFError("the tmux control client exited")
                ok, lines = block
                output.extend(lines)
                if not ok:
                    break
        return ok, "".join(line + "\n" for line in output)

    def close(self):
        try:
            self.proc.kill()
            self.proc.wait()
        except OSError:
            pass


class Tmux:
    """Runs tmux commands for one session: through a control client, or a tmux process per call as fallback."""

    def __init__(self):
        self.lock = threading.Lock()
        self.clients = {}

    def run(self, req, commands):
        key = (tuple(req["tmux"]), req["target"], req.get("user"))
        try:
            return self.client(key).run(commands)
        except (OSError, EOFError, queue.Empty):
            self.drop(key)
        return self.run_process(req, commands)

    def client(self, key):
        with self.lock:
            client = self.clients.get(key)
            if client is None or client.proc.poll() is not None:
                client = self.clients[key] = ControlClient(list(key[0]), key[1], key[2])
            return client

    def drop(self, key):
        with self.lock:
            client = self.clients.pop(key, None)
        if client is not None:
            client.close()

    @staticmethod
    def run_process(req, commands):
        argv = list(req["tmux"])
        for index, command in enumerate(commands):
            # As argv, an argument ending in ';' separates commands, and a final '\\;' means ';'.
            argv += ([";"] if index else []) + [arg[:-1] + "\\;" if arg.endswith(";") else arg for arg in command]
        code, out, err = run_tmux(argv, req.get("user"))
        return code == 0, out if code == 0 else err


TMUX = Tmux()


def op_commands(req):
    ok, out = TMUX.run(req, req["commands"])
    return {"rc": 0 if ok else 1, "out": out if ok else "", "err": "" if ok else out}


class ShellExited(Exception):
    """The pane's shell is a zombie: it exited and tmux has not reaped it yet."""


class Shell:
    """What /proc and the pty say about the shell in the tmux pane."""

    def __init__(self, pid, tty):
        self.pid = pid
        self.tty = os.open(tty, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK)

    def close(self):
        os.close(self.tty)

    def switches(self):
        total = 0
        with open(f"/proc/{self.pid}/status") as handle:
            for line in handle:
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    total += int(line.split()[1])
        return total

    def queued(self, request):
        return struct.unpack("i", fcntl.ioctl(self.tty, request, b"\0\0\0\0"))[0]

    def idle(self, before):
        """At its prompt: asleep, owning the terminal, has run since the keys were sent, no bytes in flight."""
        with open(f"/proc/{self.pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
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
        """A process in the shell's own group means a command substitution or similar is still running."""
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != self.pid:
                try:
                    with open(f"/proc/{entry}/stat") as handle:
                        if int(handle.read().rsplit(")", 1)[1].split()[2]) == pgrp:
                            return True
                except (OSError, IndexError, ValueError):
                    continue
        return False


def op_send(req):
    """Run the tmux calls that type the keys, then wait until the shell is idle or the time is up."""
    try:
        shell = Shell(int(req["pane_pid"]), req["pane_tty"])
    except FileNotFoundError:
        return {"gone": True}
    try:
        before = shell.switches() if req["calls"] else None
        if req["calls"]:
            ok, out = TMUX.run(req, req["calls"])
            if not ok:
                return {"gone": not os.path.exists(f"/proc/{shell.pid}"), "error": out.strip()}
        start = time.monotonic()
        timeout = float(req["timeout"])
        stable = 0
        while True:
            stable = stable + 1 if shell.idle(before) else 0
            waited = time.monotonic() - start
            if stable >= 2 or waited >= timeout:
                return {"waited": waited, "idle": stable >= 2}
            time.sleep(min(POLL_S, max(timeout - waited, 0)))
    except ShellExited:
        return {"gone": True}
    except (OSError, ValueError) as exc:
        gone = not os.path.exists(f"/proc/{shell.pid}")
        return {"gone": gone, "error": None if gone else f"{type(exc).__name__}: {exc}"}
    finally:
        shell.close()


def op_capture(req):
    """Lines from the anchor (absolute index: history size + cursor row at the last capture) to the screen's end.

    The position and the lines are read in one tmux command list, which tmux runs without
    reading the pane in between. The host's last known history size is the first guess of
    where the anchor is; when output moved it, retry with the size just read.
    """
    target, anchor = req["target"], req.get("anchor")
    where = ["display-message", "-p", "-t", target, "#{history_size} #{cursor_y}"]
    history = req.get("history")
    if history is None or anchor is None:
        ok, out = TMUX.run(req, [where])
        if not ok:
            return {"rc": 1, "err": out}
        history = int(out.split()[0])
    for _ in range(5):
        start = max(anchor - history, -history) if anchor is not None else 0
        ok, out = TMUX.run(req, [where, ["capture-pane", "-p", "-t", target, "-S", str(start), "-E", "-"], where])
        if not ok:
            return {"rc": 1, "err": out}
        first, _, rest = out.partition("\n")
        text, _, last = rest.rstrip("\n").rpartition("\n")
        if first == last and int(first.split()[0]) == history:
            return {"rc": 0, "text": text, "history": history, "cursor": int(first.split()[1]), "start": start}
        history = int(last.split()[0])
    return {"rc": 0, "moving": True}


def op_read(req):
    try:
        with open(req["path"], "rb") as handle:
            data = handle.read(int(req["max_bytes"]))
    except FileNotFoundError:
        return {"data": None}
    return {"data": base64.b64encode(data).decode()}


OPS = {
    "exec": op_exec, "tmux": op_tmux, "commands": op_commands, "send": op_send, "capture": op_capture,
    "read": op_read, "ping": lambda req: {"pid": os.getpid()},
}  # fmt: skip


def main():
    lock = threading.Lock()

    def reply(message):
        data = (json.dumps(message) + "\n").encode()
        with lock:
            while data:
                data = data[os.write(1, data) :]

    def handle(req):
        try:
            result = OPS[req["op"]](req)
            result.update(id=req["id"], ok=True)
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the host, never kills the agent
            result = {"id": req.get("id"), "ok": False, "error": f"{type(exc).__name__}: {exc}"}
        reply(result)

    for line in sys.stdin.buffer:
        threading.Thread(target=handle, args=(json.loads(line.decode()),), daemon=True).start()
    if "--stop-container-on-eof" in sys.argv:
        os.kill(1, signal.SIGTERM)


if __name__ == "__main__":
    main()
