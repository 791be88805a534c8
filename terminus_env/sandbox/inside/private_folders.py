"""The host's private folders (/tests and /logs/verifier): tmpfs mounts the agent's side never has, held open by the
daemon, so that everything read from or deleted in them goes through a descriptor and a folder put in their place is
caught (AgentFault)."""

import base64
import errno
import io
import os
import stat
import tarfile


class AgentFault(Exception):
    """Something the agent's side controls made the request impossible; the host counts it as the agent's doing."""


class NotRegular(OSError):
    """A file the verifier left is not a regular file (a folder, a FIFO, a link): its content is not trusted."""


VERIFIER_FOLDERS = ("/tests", "/logs/verifier")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class PrivateFolder:
    """One of the host's private tmpfs folders, held open since the daemon started: what the verifier gets must
    be this very folder, and everything read from or deleted in it goes through this descriptor, never a path."""

    def __init__(self, path):
        self.path = path
        self.fd = os.open(path, _DIR_FLAGS)
        mine = os.fstat(self.fd)
        if mine.st_dev == os.stat("/").st_dev:
            raise OSError(errno.EIO, "{} is not the host's private mount".format(path))
        self.identity = (mine.st_dev, mine.st_ino)

    def check(self, root=""):
        """Raise AgentFault unless ``root + path`` still leads to this folder."""
        try:
            now = os.stat(root + self.path, follow_symlinks=False)
            found = (now.st_dev, now.st_ino)
        except OSError as exc:
            found = exc.strerror
        if found != self.identity:
            raise AgentFault("{}{} is no longer the verifier's private folder ({}): it was tampered with".format(
                root, self.path, found))  # fmt: skip

    def empty(self):
        _empty_dir(self.fd)

    def unpack(self, data):
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
            for member in archive.getmembers():
                bad = member.name.startswith("/") or ".." in member.name.split("/")
                if bad or not (member.isfile() or member.isdir()):
                    raise ValueError("refusing tests archive member {!r}: plain files and folders only"
                                     .format(member.name))  # fmt: skip
            archive.extractall("/proc/self/fd/{}".format(self.fd))

    def read(self, relative, max_bytes):
        """The file's first ``max_bytes`` bytes, None if missing; NotRegular unless it is a plain file."""
        parts = [part for part in relative.split("/") if part]
        fds = [self.fd]
        try:
            for part in parts[:-1]:
                fds.append(os.open(part, _DIR_FLAGS, dir_fd=fds[-1]))
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fds[-1])
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise NotRegular(exc.errno, "{}/{} cannot be read as a file: {}".format(self.path, relative,
                                                                                  exc.strerror)) from None
        finally:
            for opened in fds[1:]:
                os.close(opened)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise NotRegular(errno.EINVAL, "{}/{} is not a regular file".format(self.path, relative))
            return _read_fd(fd, max_bytes)
        finally:
            os.close(fd)


def _empty_dir(fd):
    """Delete everything in the folder open at ``fd``, never following a link."""
    for name in os.listdir(fd):
        try:
            mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
            if stat.S_ISDIR(mode):
                sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
                try:
                    _empty_dir(sub)
                finally:
                    os.close(sub)
                os.rmdir(name, dir_fd=fd)
            else:
                os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            continue


def _read_fd(fd, max_bytes):
    chunks, left = [], max_bytes
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _b64(data):
    return None if data is None else base64.b64encode(data).decode()
