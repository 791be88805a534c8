"""One sandbox cannot use up a host-wide kernel resource for the others, played with two sandboxes.

Every container's root is the host's uid 0, so the kernel's per-user counts (inotify instances and watches, epoll
watches) and its host-wide pools (AIO contexts, terminals, open files) are shared by every sandbox and the host.
The sandbox denies AIO contexts (``io_setup`` answers ENOSYS), caps each container's terminals (its devpts), and
``scripts/ensure-docker.sh`` raises the per-user counts past what any sandbox's memory limit lets it allocate.
"""

from __future__ import annotations

import errno
import textwrap
from pathlib import Path

import pytest
from sandbox_support import SPEC, Runner, run_fixture  # noqa: F401

from terminus_env.sandbox import Sandbox

pytestmark = pytest.mark.docker

INOTIFY_INSTANCES = 5000  # far past the kernel's default of 128 for all of one user's processes together

HOG = textwrap.dedent(f"""\
    import ctypes, errno, os, pty, time
    libc = ctypes.CDLL(None, use_errno=True)
    out = open("/tmp/hog.tmp", "w")  # before the descriptors run out
    held = []
    for _ in range({INOTIFY_INSTANCES}):
        fd = libc.inotify_init1(0)
        if fd < 0:
            print("inotify_init1:", os.strerror(ctypes.get_errno()), "after", len(held), flush=True)
            break
        held.append(fd)
    instances = len(held)
    terminals = 0
    while True:
        try:
            held.extend(pty.openpty())
            terminals += 1
        except OSError:
            break
    context = ctypes.c_ulong(0)
    aio = libc.syscall(206 if os.uname().machine == "x86_64" else 0, 128, ctypes.byref(context))
    aio_errno = ctypes.get_errno() if aio != 0 else 0
    out.write("{{}} {{}} {{}}\\n".format(instances, terminals, aio_errno))
    out.close()
    os.rename("/tmp/hog.tmp", "/tmp/hog")
    time.sleep(600)
""")

PROBE = textwrap.dedent("""\
    import ctypes, pty
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(0)
    print(fd >= 0, ctypes.get_errno(), len(pty.openpty()))
""")


def _aio_in_use() -> int:
    return int(Path("/proc/sys/fs/aio-nr").read_text())


def test_one_sandbox_holding_all_it_can_leaves_the_others_theirs(run: Runner) -> None:
    aio_before = _aio_in_use()

    async def scenario():
        async with await Sandbox.start(SPEC) as hog, await Sandbox.start(SPEC) as other:
            await hog.put_file(HOG.encode(), "/tmp/hog.py")
            await hog.exec("(setsid python3 /tmp/hog.py > /tmp/hog.log 2>&1 &)", 10)
            held = await hog.exec("for i in $(seq 600); do [ -e /tmp/hog ] && break; sleep 0.1; done; cat /tmp/hog "
                                  "/tmp/hog.log", 90)  # fmt: skip
            await other.put_file(PROBE.encode(), "/tmp/probe.py")
            probe = await other.exec("python3 /tmp/probe.py", 30)
            aio_during = _aio_in_use()
            return held.output, probe.output, aio_during

    held, probe, aio_during = run(scenario())
    assert held.split()[:1] and held.split()[0].isdigit(), repr(held)  # what the hog said, or why it failed
    instances, terminals, aio_errno = (int(word) for word in held.split()[:3])
    assert instances == INOTIFY_INSTANCES, (
        f"the hog got only {instances} inotify instances: the host's fs.inotify.max_user_instances is too low for "
        "sandboxes that share uid 0 (scripts/ensure-docker.sh raises it)"
    )
    assert 200 < terminals <= 256, held  # capped at the container's own 256, minus what its terminal holds
    assert aio_errno == errno.ENOSYS and aio_during == aio_before  # no AIO context taken from the host's pool
    assert probe.split() == ["True", "0", "2"], probe  # the other sandbox still gets an instance and a terminal
