"""Part 2, on the host's side: the container's end of the control channel. The daemon reaches the host (DIRECT) or
takes the relay's streams (RELAY), proves the peer is the host, then sends one JSON line per reply; on a DIRECT
channel its stderr goes the same way (ErrorLines)."""

import errno
import json
import os
import socket
import struct
import sys
import threading
import time

from .names import DIRECT

SO_PEERCRED = 17


def take_channel(path, channel, wait_s):
    """Reach the host through socket ``path`` and make its channel this process's stdin and stdout. Returns the
    connection, to be held open until this process ends.

    DIRECT: the host listens on a socket in CHANNEL_DIR, a folder of the host's that a local engine mounts (the
    agent's and the verifier's sides have it covered), and this process connects to it; the peer must be outside
    the container's PID namespace (pid 0 as this process sees it), so nothing in the container can pose as the
    host. The socket carries the JSON lines both ways, and what this process writes to its stderr goes on it as
    lines of their own (ErrorLines). RELAY: the host's ``docker exec`` runs the relay of the host's channel.py,
    which connects to CHANNEL_SOCKET on the host's side (the agent's and the verifier's sides have their own
    RUN_DIR) and passes its stdin, stdout and stderr over; this process takes one connection from root, then
    removes the socket.
    """
    if channel == DIRECT:
        host = _connect_to_host(path, wait_s)
        os.dup2(host.fileno(), 0)
        os.dup2(host.fileno(), 1)
        sys.stderr = ErrorLines()
        return host
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        os.chmod(path, 0o600)
        listener.listen(1)
        listener.settimeout(wait_s)
        relay, _ = listener.accept()
    finally:
        listener.close()
        try:
            os.unlink(path)
        except OSError:
            pass
    relay.settimeout(None)
    _, uid = _peer(relay)
    if uid != 0:
        raise PermissionError("the channel's relay runs as uid {}, not root".format(uid))
    _, ancillary, _, _ = relay.recvmsg(1, socket.CMSG_SPACE(3 * 4))
    fds = [fd for level, kind, data in ancillary if (level, kind) == (socket.SOL_SOCKET, socket.SCM_RIGHTS)
           for fd in struct.unpack("{}i".format(len(data) // 4), data[: len(data) // 4 * 4])]  # fmt: skip
    if len(fds) != 3:
        raise OSError(errno.EPROTO, "the channel's relay passed {} streams, not 3".format(len(fds)))
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    return relay


def _connect_to_host(path, wait_s):
    """The host listens before the container starts: looks are for a host that is slow to, not a race."""
    deadline, pause = time.monotonic() + wait_s, 0.001
    while True:
        host = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            host.connect(path)
            break
        except (FileNotFoundError, ConnectionRefusedError):
            host.close()
            if time.monotonic() > deadline:
                raise socket.timeout("the host did not listen on {} within {} s".format(path, wait_s)) from None
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
    pid, uid = _peer(host)
    if pid != 0 or uid != 0:
        raise PermissionError("the channel's peer is process {} (uid {}) of this container, not the host"
                              .format(pid, uid))  # fmt: skip
    return host


def _peer(connection):
    """(pid, uid) of a unix socket's peer, as this process's namespaces see them (pid 0: outside them)."""
    pid, uid, _ = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, SO_PEERCRED, 12))
    return pid, uid


_SEND_LOCK = threading.Lock()


def send(message):
    """One JSON line to the host, whole: replies come from many threads."""
    data = (json.dumps(message) + "\n").encode()
    with _SEND_LOCK:
        while data:
            data = data[os.write(1, data) :]


class ErrorLines:
    """The daemon's stderr on a DIRECT channel: each line as ``{"stderr": line}`` (the container's log, where fd 2
    goes, is gone with the container; the host keeps what came for its diagnosis)."""

    def __init__(self):
        self.pending = ""
        self.lock = threading.Lock()  # tracebacks may come from several threads at once

    def write(self, text):
        with self.lock:
            self.pending += text
            *lines, self.pending = self.pending.split("\n")
        for line in lines:
            self._send(line + "\n")
        return len(text)

    def flush(self):
        with self.lock:
            pending, self.pending = self.pending, ""
        if pending:
            self._send(pending)

    @staticmethod
    def _send(text):
        try:
            send({"stderr": text})
        except OSError:  # the host is gone: nobody to tell
            pass
