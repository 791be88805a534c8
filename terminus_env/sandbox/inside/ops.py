"""The daemon's ops: each takes the Daemon and one request and returns the reply's fields; OPS names them all."""

import glob
import os
import signal
import stat

from .packages import op_packages
from .private_folders import _b64, _read_fd
from .terminal import op_capture, op_commands, op_send, op_step, op_tmux
from .verify import op_verify


def op_exec(daemon, req):
    return daemon.run(["bash", "-c", req["cmd"]], "agent", req["timeout"], user=req.get("user"), env=req.get("env"),
                      cwd=req.get("workdir"), max_output=req.get("max_output", 1000000))  # fmt: skip


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
    "packages": op_packages,
}  # fmt: skip
