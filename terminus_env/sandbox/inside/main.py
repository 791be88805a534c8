"""Part 1, on the host's side: the container's main process (``main``). Before anything of the task runs it splits
the container (the inits are in inits.py), then forks the control daemon and keeps the container alive for the
sandbox's lifetime."""

import os
import signal
import sys
import time

from .daemon import fork_daemon
from .inits import verifier_init
from .kernel import (
    CLONE_NEWPID,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_PRIVATE,
    MS_REC,
    MS_REMOUNT,
    mount,
    unshare,
)
from .names import CHANNEL_DIR, CUT_OFF, DIRECT, HOSTS, LOG_PREFIX, PRIVATE_MOUNTS, PTY_LIMIT, RUN_DIR, SPLIT_REPORT
from .network import cut_off_host, write_hosts
from .processes import _exit_code, _report_and_exit
from .seccomp import agent_capabilities, confine, seccomp_program


def main_process(argv):
    """``main LIFETIME_S HANDOVER_S FILE_LIMIT_BYTES USER NETWORK CHANNEL -- COMMAND...``: split the container, run
    COMMAND on the agent's side as USER, the image's USER ("" for root), as Docker would have run the image's
    ENTRYPOINT (a file limit of 0 sets none). NETWORK says what to do first: CUT_OFF cuts the container off the
    host (see cut_off_host), HOSTS writes the /etc/hosts Docker gives a container without a network (see
    write_hosts), anything else nothing. CHANNEL says how the host reaches the daemon (DIRECT or RELAY, see
    take_channel). This process itself runs as root whatever the image says: it needs its capabilities.

    The split, in order: a helper makes the verifier's PID namespace, whose init ("the verifier's init") makes the
    agent's PID and mount namespaces; once those exist, this process mounts the host's private folders (so the
    agent's side never has them) and lets the verifier's init copy the host's mounts into a mount namespace of its
    own, with its own /proc. Every step reports a line on one pipe; the whole report lands in RUN_DIR/split.
    """
    lifetime, handover, file_limit, user, network, channel = float(argv[0]), float(argv[1]), int(argv[2]), *argv[3:6]
    command = argv[7:]
    channel_folders = (CHANNEL_DIR,) if channel == DIRECT else ()  # shielded on the agent's and the verifier's sides
    deadline = time.monotonic() + lifetime
    signal.signal(signal.SIGTERM, lambda *_: os._exit(143))
    if network == HOSTS:
        write_hosts()
    elif network == CUT_OFF:
        try:
            cut_off_host()
        except OSError as exc:  # nothing of the task may run then: say so to the daemon, which tells the host
            os.makedirs(RUN_DIR, exist_ok=True)
            _write_atomically(SPLIT_REPORT, "cannot cut the container off the host: {}\n".format(exc).encode())
            fork_daemon(file_limit, channel)  # which tells the host
            time.sleep(lifetime)
            os._exit(1)
    program = seccomp_program()
    keep = agent_capabilities()
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing mounted on one side reaches another
    notes = _cap_terminals()
    for path, _ in PRIVATE_MOUNTS:
        os.makedirs(path, exist_ok=True)
    read_end, write_end = os.pipe()
    go_read, go_write = os.pipe()
    helper = os.fork()
    if helper == 0:
        try:
            os.close(read_end)
            os.close(go_write)
            unshare(CLONE_NEWPID)
            init = os.fork()
            if init == 0:
                verifier_init(command, user, handover, keep, program, write_end, go_read, file_limit, channel_folders)
            os.write(write_end, "verifier {}\n".format(init).encode())
            os.close(write_end)
            os.close(go_read)
            os._exit(_exit_code(os.waitpid(init, 0)[1]))
        except BaseException as exc:  # noqa: BLE001
            _report_and_exit(write_end, "verifier namespaces", exc)
    os.close(write_end)
    os.close(go_read)
    report = b""
    mounted = False
    while True:
        chunk = os.read(read_end, 4096)
        if not chunk:
            break
        report += chunk
        if not mounted and b"agent-split" in report:  # the agent's side keeps the bare folders
            for path, options in PRIVATE_MOUNTS:
                mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, options)
            mounted = True
            os.write(go_write, b"go")
            os.close(go_write)
    if not mounted:
        os.close(go_write)
    os.close(read_end)
    report += notes
    _write_atomically(SPLIT_REPORT, report)
    fork_daemon(file_limit, channel)
    confine(keep, program)
    for line in report.decode("utf-8", "replace").splitlines():  # the log's own lines, told apart by their prefix
        sys.stderr.write(LOG_PREFIX + line + "\n")
    sys.stderr.flush()
    while time.monotonic() < deadline:  # the lifetime backstop: the container ends with this process
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            pid = 0
        if not pid:
            time.sleep(min(1.0, max(deadline - time.monotonic(), 0)))
    os._exit(0)


def _cap_terminals():
    """At most PTY_LIMIT terminals for this container: every container's terminals count against one host-wide limit
    (kernel.pty.max), so one sandbox opening them in a loop would leave none for the others' terminals. The devpts
    options are per mount (Docker gives each container its own), and a remount resets the ones it does not name, so
    the current ones are named again. What goes wrong is said, never fatal (the report's note)."""
    try:
        with open("/proc/self/mountinfo") as handle:
            for line in handle:
                fields = line.split()
                separator = fields.index("-")
                if fields[4] == "/dev/pts" and fields[separator + 1] == "devpts":
                    kept = [option for option in fields[separator + 3].split(",")
                            if option.split("=")[0] not in ("rw", "ro", "max")]  # fmt: skip
                    data = ",".join(kept + ["max={}".format(PTY_LIMIT)])
                    mount("devpts", "/dev/pts", "devpts", MS_REMOUNT | MS_NOSUID | MS_NOEXEC, data)
                    return b""
    except (OSError, ValueError) as exc:
        return "note: terminals not capped at {}: {}\n".format(PTY_LIMIT, exc).encode()
    return "note: terminals not capped at {}: no devpts at /dev/pts\n".format(PTY_LIMIT).encode()


def _write_atomically(path, data):
    temporary = path + ".tmp"
    with open(temporary, "wb") as handle:
        handle.write(data)
    os.rename(temporary, path)


if __name__ == "__main__" and sys.argv[1:2] == ["main"]:
    main_process(sys.argv[2:])
