"""Who started whom, taken while each verifier process waits at its exec: the kernel holds the process (fanotify's
permission event for an exec) until this thread has read its start time and its parent's from /proc, so a writer
gone before the watch read its events is still known, however late they are read. A process that forked without
exec is not seen here; the watch reads it live, or fails closed."""

import os
import select
import threading

from .kernel import FAN_ALLOW, FANOTIFY_EVENT, FANOTIFY_RESPONSE
from .processes import identity_of

MAX_LEVELS = 64  # of ancestors recorded at one exec (the test script is a few levels up)


class ExecWitness:
    """Answers every exec permission event of one fanotify group (always allowing it) on its own thread, after
    recording ``pid -> (start time, parent pid)`` for the process and the verifier processes above it. The watch's
    thread may be the one waiting for that exec (the daemon starts the test script and waits for its exec), so the
    answers never wait for it."""

    def __init__(self, group, daemon):
        self.group = group
        self.daemon = daemon
        self.known = {}  # pid -> (start time, parent pid), as last seen at an exec
        self._wake_read, self._wake_write = os.pipe()  # close() wakes the thread at once (non-inheritable)
        self._thread = threading.Thread(target=self._answer_all, name="exec-witness", daemon=True)
        try:
            self._thread.start()
        except BaseException:
            os.close(self._wake_read)
            os.close(self._wake_write)
            raise

    def seen(self, pid):
        """(start time, parent pid) of ``pid`` as recorded at its last exec, or of an ancestor's; None if never."""
        return self.known.get(pid)

    def _answer_all(self):
        poller = select.poll()
        poller.register(self.group, select.POLLIN)
        poller.register(self._wake_read, select.POLLIN)
        while True:
            try:
                ready = [fd for fd, _ in poller.poll()]
                if self._wake_read in ready:
                    return
                data = os.read(self.group, 65536)
            except BlockingIOError:
                continue
            except OSError:
                return  # the group is gone: the watch closed it
            offset = 0
            while offset + FANOTIFY_EVENT.size <= len(data):
                length, _, _, _, _, fd, pid = FANOTIFY_EVENT.unpack_from(data, offset)
                offset += max(length, FANOTIFY_EVENT.size)
                if fd < 0:
                    continue
                try:
                    self._record(pid)
                except (OSError, ValueError, IndexError):
                    pass  # a process that cannot be read is left unknown: the watch fails closed on it
                finally:
                    try:
                        os.write(self.group, FANOTIFY_RESPONSE.pack(fd, FAN_ALLOW))
                    finally:
                        os.close(fd)

    def _record(self, pid):
        current = pid
        for _ in range(MAX_LEVELS):
            self.known[current] = identity = identity_of(current)
            parent = identity[1]
            if parent == self.daemon.verifier_init or not self.daemon.in_verifier_namespace(parent):
                return
            current = parent

    def close(self):
        """Stop answering; the group's owner closes it (what is still waiting is allowed then)."""
        os.write(self._wake_write, b"x")
        self._thread.join()
        os.close(self._wake_read)
        os.close(self._wake_write)
