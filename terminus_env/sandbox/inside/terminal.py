"""The terminal's ops: type the keys, wait until the pane's shell is idle (what /proc and the pty say), and read what
is new on the pane and the screen."""

import fcntl
import os
import struct
import time

from .processes import _pids, _stat_fields

FIONREAD = 0x541B
TIOCOUTQ = 0x5411
POLL_S = 0.002  # the idle check's longest pause
POLL_FIRST_S = 0.0002  # and its first: pauses double from here


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
