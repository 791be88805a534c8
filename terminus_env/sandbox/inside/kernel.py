"""The kernel's interfaces that the standard library lacks, through libc: prctl, namespaces, mounts, capabilities."""

import ctypes
import errno
import os
import struct

_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NAME, PR_SET_SECCOMP = 1, 4, 15, 22
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 24, 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
SECCOMP_MODE_FILTER = 2
FANOTIFY_EVENT = struct.Struct("IBBHQii")  # struct fanotify_event_metadata
FANOTIFY_RESPONSE = struct.Struct("iI")  # struct fanotify_response
FAN_ALLOW, FAN_DENY = 0x1, 0x2
CLONE_NEWNS, CLONE_NEWPID = 0x00020000, 0x20000000
CLONE_NAMESPACES = 0x7E020000  # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    1, 2, 4, 8, 32, 4096, 16384, 1 << 18)  # fmt: skip
CAPABILITIES = (
    "CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP LINUX_IMMUTABLE NET_BIND_SERVICE "
    "NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER SYS_MODULE SYS_RAWIO SYS_CHROOT SYS_PTRACE SYS_PACCT "
    "SYS_ADMIN SYS_BOOT SYS_NICE SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP "
    "MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ PERFMON BPF CHECKPOINT_RESTORE"
).split()


def _ok(result, what):
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, "{}: {}".format(what, os.strerror(code)))


def prctl(option, arg2=0):
    _ok(_libc.prctl(option, ctypes.c_ulong(arg2), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)),
        "prctl({})".format(option))  # fmt: skip


def unshare(flags):
    _ok(_libc.unshare(flags), "unshare")


def setns(fd, nstype):
    _ok(_libc.setns(fd, nstype), "setns")


def mount(source, target, fstype, flags, data=None):
    def c(text):
        return None if text is None else text.encode()

    _ok(_libc.mount(c(source), c(target), c(fstype), ctypes.c_ulong(flags), c(data)), "mount " + target)


def capset(caps):
    """Effective and permitted become exactly ``caps`` (numbers); inheritable becomes empty."""
    mask = 0
    for cap in caps:
        mask |= 1 << cap
    header = struct.pack("Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = struct.pack("6I", mask & 0xFFFFFFFF, mask & 0xFFFFFFFF, 0, mask >> 32, mask >> 32, 0)
    _ok(_libc.capset(ctypes.c_char_p(header), ctypes.c_char_p(data)), "capset")


def own_capabilities():
    """The capability numbers in this process's bounding set."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("CapBnd:"):
                bits = int(line.split()[1], 16)
                return {cap for cap in range(64) if bits >> cap & 1}
    raise OSError(errno.ENOENT, "no CapBnd in /proc/self/status")
