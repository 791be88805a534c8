"""The confinement of everything the daemon and the inits start: Docker's seccomp rules for a container without
CAP_SYS_ADMIN, on top of the container's own, and the capabilities only the daemon keeps."""

import ctypes
import errno
import os
import struct

from .kernel import (
    CAPABILITIES,
    CLONE_NAMESPACES,
    PR_CAP_AMBIENT,
    PR_CAP_AMBIENT_CLEAR_ALL,
    PR_CAPBSET_DROP,
    PR_SET_NO_NEW_PRIVS,
    PR_SET_SECCOMP,
    SECCOMP_MODE_FILTER,
    _libc,
    _ok,
    capset,
    own_capabilities,
    prctl,
)

# Only the daemon keeps these; everything it or the main process starts runs without them.
DAEMON_ONLY_CAPS = ("SYS_ADMIN", "SYS_CHROOT", "SETPCAP", "NET_ADMIN", "LINUX_IMMUTABLE")
AUDIT_ARCH = {"x86_64": 0xC000003E, "i386": 0x40000003, "aarch64": 0xC00000B7}
# The syscalls Docker's default profile allows only with CAP_SYS_ADMIN, by ABI, and the io_uring calls, which its
# current profile denies to every container (they bypass seccomp's view of the calls they submit). clone is
# allowed without namespace flags; clone3 cannot be inspected, so it answers ENOSYS and libc falls back to clone.
# io_setup answers ENOSYS too, as on a kernel without native AIO (libaio's users fall back to threads): every AIO
# context counts against one host-wide limit (fs.aio-max-nr), so one sandbox could leave none for the others.
_SYSCALLS = {
    # name: (x86_64, i386, aarch64); None where the ABI has no such call
    "clone": (56, 120, 220), "clone3": (435, 435, 435), "unshare": (272, 310, 97), "setns": (308, 346, 268),
    "mount": (165, 21, 40), "umount": (None, 22, None), "umount2": (166, 52, 39), "pivot_root": (155, 217, 41),
    "bpf": (321, 357, 280), "perf_event_open": (298, 336, 241), "fanotify_init": (300, 338, 262),
    "lookup_dcookie": (212, 253, 18), "name_to_handle_at": (303, 341, 264), "quotactl": (179, 131, 60),
    "quotactl_fd": (443, 443, 443), "setdomainname": (171, 121, 162), "sethostname": (170, 74, 161),
    "syslog": (103, 103, 116), "open_tree": (428, 428, 428), "move_mount": (429, 429, 429),
    "fsopen": (430, 430, 430), "fsconfig": (431, 431, 431), "fsmount": (432, 432, 432), "fspick": (433, 433, 433),
    "mount_setattr": (442, 442, 442), "io_uring_setup": (425, 425, 425), "io_uring_enter": (426, 426, 426),
    "io_uring_register": (427, 427, 427), "io_setup": (206, 245, 0),
}  # fmt: skip
# What the verifier's side may not do to another process: a program the tests run, as root like the test script,
# could otherwise attach to the script's shell (or to pytest) and change what it writes as the reward. ptrace is
# refused only its two requests that take hold of a running process: a tracer that starts its own tracee
# (PTRACE_TRACEME, as gdb runs a program) still works. Writing another's memory through /proc is refused by the
# side's read-only /proc (see inits.verifier_init).
_TRACING_SYSCALLS = {"ptrace": (101, 26, 117), "process_vm_writev": (311, 348, 271), "pidfd_getfd": (438, 438, 438)}
PTRACE_ATTACH, PTRACE_SEIZE = 16, 0x4206
_ABI_COLUMN = {"x86_64": 0, "i386": 1, "aarch64": 2}
_NATIVE_ABIS = {"x86_64": ("x86_64", "i386"), "aarch64": ("aarch64",)}
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06


def seccomp_program(machine=None, untraceable=False):
    """A classic BPF program (bytes of struct sock_filter) denying the calls above on this machine's ABIs, and with
    ``untraceable`` the taking hold of another process (the verifier's side).

    Calls from an ABI the machine does not natively run answer ENOSYS, as do x32 calls on x86_64.
    """
    machine = machine or os.uname().machine
    if machine not in _NATIVE_ABIS:
        raise OSError(errno.ENOSYS, "unsupported machine {!r}: the sandbox runs on x86_64 or aarch64".format(machine))
    code, labels = [], {}

    def emit(op, k=0, jt=None, jf=None):
        code.append([op, jt, jf, k])

    abis = _NATIVE_ABIS[machine]
    emit(_LD_W_ABS, 4)  # seccomp_data.arch
    for abi in abis:
        emit(_JEQ, AUDIT_ARCH[abi], jt="abi:" + abi)
    emit(_RET, _ERRNO | errno.ENOSYS)
    denied = dict(_SYSCALLS, **(_TRACING_SYSCALLS if untraceable else {}))
    for abi in abis:
        labels["abi:" + abi] = len(code)
        emit(_LD_W_ABS, 0)  # seccomp_data.nr
        if abi == "x86_64":
            emit(_JGE, 0x40000000, jt="enosys")  # the x32 ABI
        column = _ABI_COLUMN[abi]
        targets = {"clone": "clone:" + abi, "clone3": "enosys", "io_setup": "enosys", "ptrace": "ptrace"}
        for name, numbers in sorted(denied.items()):
            nr = numbers[column]
            if nr is None:
                continue
            emit(_JEQ, nr, jt=targets.get(name, "eperm"))
        emit(_RET, _ALLOW)
        labels["clone:" + abi] = len(code)
        emit(_LD_W_ABS, 16)  # the low half of args[0]: clone's flags on these little-endian ABIs
        emit(_JSET, CLONE_NAMESPACES, jt="eperm")
        emit(_RET, _ALLOW)
    if untraceable:
        labels["ptrace"] = len(code)
        emit(_LD_W_ABS, 16)  # ptrace's request
        emit(_JEQ, PTRACE_ATTACH, jt="eperm")
        emit(_JEQ, PTRACE_SEIZE, jt="eperm")
        emit(_RET, _ALLOW)
    labels["eperm"] = len(code)
    emit(_RET, _ERRNO | errno.EPERM)
    labels["enosys"] = len(code)
    emit(_RET, _ERRNO | errno.ENOSYS)
    out = []
    for index, (op, jt, jf, k) in enumerate(code):
        jumps = [0 if label is None else labels[label] - index - 1 for label in (jt, jf)]
        if not all(0 <= jump < 256 for jump in jumps):
            raise OverflowError("seccomp jump out of range")
        out.append(struct.pack("HBBI", op, jumps[0], jumps[1], k))
    return b"".join(out)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_seccomp(program):
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.addressof(buffer))
    _ok(_libc.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.c_void_p(ctypes.addressof(fprog)),
                    ctypes.c_ulong(0), ctypes.c_ulong(0)), "prctl(PR_SET_SECCOMP)")  # fmt: skip


def confine(keep, program, current=None):
    """Keep only the capabilities ``keep`` for good (bounding, effective, permitted), then add the filter.
    ``current``: this process's bounding set, where it has no /proc to read it from."""
    current = own_capabilities() if current is None else current
    for cap in sorted(current - keep):
        prctl(PR_CAPBSET_DROP, cap)
    try:
        prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    except OSError:  # kernels before 4.3 have no ambient set
        pass
    capset(keep & current)
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    install_seccomp(program)


def agent_capabilities():
    """What the agent's side keeps: the container's capabilities without the daemon's."""
    return own_capabilities() - {CAPABILITIES.index(name) for name in DAEMON_ONLY_CAPS}
