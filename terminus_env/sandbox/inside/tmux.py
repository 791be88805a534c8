"""The terminal's tmux as the daemon drives it: a control-mode client kept attached on the terminal's side, or a tmux
process per call on the agent's side as the fallback."""

import os
import queue
import select
import threading
import time

from .processes import CappedBuffer, SpawnError, stream_pair


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
