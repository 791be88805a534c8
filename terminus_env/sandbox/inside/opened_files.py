"""What a file the verifier opened is, from its name, its handle and its first bytes: the watch's helpers, each of
which reads only the descriptor or path it is given."""

import os
import stat

from .code_files import CODE_MAGIC, CODE_SUFFIXES
from .installer_files import MAX_PROVEN_BYTES


def fd_path(fd, info):
    """The path of an event's descriptor as /proc names it (OSError past PATH_MAX: the watch records that as lost)."""
    path = os.readlink("/proc/self/fd/{}".format(fd))
    if info.st_nlink == 0 and path.endswith(" (deleted)"):  # gone already: its name when it went
        path = path[: -len(" (deleted)")]
    return path


def unrecorded_target(path):
    """A record for data a link leads to, which the watch may have opened without recording: opened early, not run.
    Code is always recorded when opened, so code without a record was not opened."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)  # never waits on a pipe
    except OSError:
        return None
    try:
        head = os.pread(fd, 4, 0) if stat.S_ISREG(os.fstat(fd).st_mode) else None
    except OSError:
        head = None
    finally:
        os.close(fd)
    if head is None or path.endswith(CODE_SUFFIXES) or head.startswith(CODE_MAGIC):
        return None
    return {"exec": False, "early": True, "head": head}


def _source_name(path):
    """The name of the Python file ``path`` is, or is the bytecode of (pytest loads the modules it rewrote, test
    files and conftests, from ``__pycache__`` without opening the source)."""
    folder, name = os.path.split(path)
    if os.path.basename(folder) == "__pycache__" and name.endswith(".pyc"):
        return name.split(".")[0] + ".py"
    return name


def is_test_file(path, in_tests=False):
    """A file a test runner collects: a Python file in /tests, or ``test_*.py`` / ``*_test.py`` anywhere, or the
    bytecode of one."""
    name = _source_name(path)
    if not name.endswith(".py"):
        return False
    return in_tests or name.startswith("test_") or name.endswith("_test.py")


def is_conftest(path):
    """A pytest ``conftest.py``, or the bytecode of one."""
    return _source_name(path) == "conftest.py"


def is_code(record):
    magic = (record["head"] or b"")[:4]
    return (record["exec"] or bool(record.get("zip")) or magic.startswith(CODE_MAGIC)
            or record["path"].endswith(CODE_SUFFIXES))  # fmt: skip


ZIP_END = b"PK\x05\x06"
ZIP_TAIL = 65535 + 22  # a zip's end record, with the longest comment it may carry


def is_zip(fd, size):
    """Whether Python's zipimport (and pip, and zipfile) would read this file as a zip: they find the archive by its
    end record, looked for in its last 64 KiB, whatever comes before it; so is it found here."""
    if size < 22:
        return False
    tail = os.pread(fd, min(size, ZIP_TAIL), max(0, size - ZIP_TAIL))
    return ZIP_END in tail


def read_whole(fd, size):
    """The whole file, if it is small enough to be an installer's (else None: not one)."""
    return os.pread(fd, size, 0) if size <= MAX_PROVEN_BYTES else None


def pth_files(path, head):
    """The files a ``.pth`` file's path lines put on Python's path: only a zip can be imported from a file, so each
    is code Python may import at every start."""
    folder, found = os.path.dirname(path), []
    for line in (head or b"").decode("utf-8", "replace").splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "import ", "import\t")):
            continue
        target = os.path.join(folder, line)
        if os.path.isfile(target):
            found.append(target)
    return found[:20]


def is_runner_file(path):
    """A file of a Python test runner's own package (pytest's), or its program: the runner has started."""
    return (
        "/_pytest/" in path or path.endswith("/pytest/__init__.py") or os.path.basename(path) in ("pytest", "py.test")
    )
