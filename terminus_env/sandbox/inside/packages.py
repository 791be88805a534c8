"""What the host needs to prove that a file the verifier ran is a Debian package's own: this side only reads.

A program or library the agent installed with its package manager is changed in this container like one it wrote
itself; only its provenance tells them apart. The host proves it (``sandbox/provenance.py``): the file's bytes, as
the verifier loaded them (``PACKAGED_DIRS``, hashed by the watch), are a member at the same path of a package
archive that is either the image's own (unchanged here) or listed, by its hash, in a package index whose hash a
release file signed by a key of the image lists. Here the daemon gathers the pieces, which prove nothing on their
own: the package lists' release files (checked on the host), each index's hash with the hashes it lists for the
packages that own the files, and those packages' archives. dpkg's records and the archives' names only say where
to look; a lie there makes the proof fail, never succeed.
"""

import hashlib
import os
import stat
import zlib

from .private_folders import _b64

PACKAGED_DIRS = ("/usr/bin/", "/usr/sbin/", "/usr/lib/", "/usr/libexec/", "/usr/share/", "/bin/", "/sbin/", "/lib/",
                 "/lib32/", "/lib64/", "/libx32/", "/usr/lib32/", "/usr/lib64/", "/usr/libx32/")  # fmt: skip
"""Where Debian's packages put programs and libraries (never /usr/local): a changed code file here is hashed as the
verifier loads it."""
MERGED_ROOTS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
DPKG_INFO = "/var/lib/dpkg/info"
APT_LISTS = "/var/lib/apt/lists"
SKIPPED = ("/proc", "/sys", "/dev", "/run")
MAX_HASHED_BYTES = 256 << 20  # a changed file larger than this is not hashed (and so never proved)
MAX_RELEASE_BYTES = 4 << 20
MAX_INDEX_BYTES = 256 << 20  # Debian's largest index is about 50 MB; a larger one is not read (no proof)
MAX_ARCHIVE_BYTES = 64 << 20  # all archives together
MAX_WALKED = 400000  # entries of the file system looked at for archives


def packaged_candidate(path):
    """Whether a changed code file at ``path`` may be a package's own (so the watch hashes it)."""
    return path.startswith(PACKAGED_DIRS)


def sha256_of(fd, size):
    """The hex SHA-256 of an open file, or None when it is too large to be worth proving."""
    if size > MAX_HASHED_BYTES:
        return None
    digest, offset = hashlib.sha256(), 0
    while True:
        chunk = os.pread(fd, 1 << 20, offset)
        if not chunk:
            return digest.hexdigest()
        digest.update(chunk)
        offset += len(chunk)


def op_packages(daemon, req):
    """For the files ``paths``: the packages dpkg says own them, the root folders that lead into /usr as the image
    made them, the release files and package indices in apt's lists, and the archives of those packages found
    anywhere (``changed``: since this container started)."""
    merged = [name for name in MERGED_ROOTS if _image_link(daemon, "/" + name, "usr/" + name)]
    wanted = set()
    for path in req["paths"]:
        wanted.add(path)
        for name in merged:
            if path.startswith("/usr/{}/".format(name)):
                wanted.add(path[len("/usr"):])
    owners = _owners(wanted)
    releases, indices = [], []
    for name in sorted(_listdir(APT_LISTS)):
        path = os.path.join(APT_LISTS, name)
        if name.endswith("InRelease"):
            data = _read(path, MAX_RELEASE_BYTES)
            if data is not None:
                releases.append({"path": path, "data": _b64(data)})
        elif name.endswith(("_Packages", "_Packages.gz")):  # apt keeps them whole, or gzipped (GzipIndexes)
            index = _index(path, owners)
            if index is not None:
                indices.append(index)
    return {"merged": merged, "owners": sorted(owners), "releases": releases, "indices": indices,
            "archives": _archives(daemon, owners)}  # fmt: skip


def _image_link(daemon, path, target):
    try:
        info = os.lstat(path)
        if not stat.S_ISLNK(info.st_mode) or info.st_ctime >= daemon.since:
            return False
        return os.readlink(path) in (target, "/" + target)
    except OSError:
        return False


def _listdir(folder):
    try:
        return os.listdir(folder)
    except OSError:
        return []


def _read(path, limit):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a link too: what it holds is checked
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        return os.pread(fd, info.st_size, 0)
    finally:
        os.close(fd)


def _owners(paths):
    """The packages whose dpkg file lists name any of ``paths`` (a hint of where to look, nothing more)."""
    owners = set()
    for name in _listdir(DPKG_INFO):
        if not name.endswith(".list"):
            continue
        data = _read(os.path.join(DPKG_INFO, name), 16 << 20)
        if data is not None and any(line in paths for line in data.decode("utf-8", "replace").splitlines()):
            owners.add(name[: -len(".list")].split(":")[0])
    return owners


def _index(path, owners):
    """A package index: its hash, and the archives it lists for ``owners`` (each one's hash and where it lies on the
    mirror)."""
    stored = _read(path, MAX_INDEX_BYTES)
    if stored is None:
        return None
    data = stored
    if path.endswith(".gz"):
        try:
            data = zlib.decompressobj(zlib.MAX_WBITS | 16).decompress(stored, MAX_INDEX_BYTES)
        except zlib.error:
            return None
    listed = []
    for stanza in data.split(b"\n\n"):
        fields = {}
        for line in stanza.split(b"\n"):
            key, _, value = line.partition(b":")
            if key in (b"Package", b"SHA256", b"Filename"):
                fields[key] = value.strip().decode("utf-8", "replace")
        if fields.get(b"Package") in owners and b"SHA256" in fields:
            listed.append([fields[b"SHA256"], fields.get(b"Filename", "")])
    return {"path": path, "sha256": hashlib.sha256(stored).hexdigest(), "listed": listed}


def _archives(daemon, owners):
    """The archives ``{package}_*.deb`` of ``owners`` anywhere on this container's own file system."""
    if not owners:
        return []
    root_dev = os.lstat("/").st_dev
    found, walked, total = [], 0, 0
    for folder, subfolders, files in os.walk("/"):
        walked += len(subfolders) + len(files)
        if walked > MAX_WALKED:
            break
        subfolders[:] = [name for name in subfolders if os.path.join(folder, name) not in SKIPPED
                         and _same_device(os.path.join(folder, name), root_dev)]  # fmt: skip
        for name in files:
            if not name.endswith(".deb") or name.split("_")[0] not in owners:
                continue
            path = os.path.join(folder, name)
            read = _archive_at(daemon, path, MAX_ARCHIVE_BYTES - total)
            if read is not None:
                changed, data = read
                total += len(data)
                found.append({"path": path, "changed": changed, "data": _b64(data)})
    return found


def _archive_at(daemon, path, limit):
    """Whether the archive at ``path`` changed in this container, and its bytes (at most ``limit``); None if it is
    no regular file. The host trusts an unchanged archive without a signature, so both answers come from one open
    file: a check by name and a second open (lstat, then open) let a process of the agent's swap its own archive, or
    a link, in between. Never through a link, never blocking on a FIFO; a file written while it is read changed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode) or before.st_size > limit:
            return None
        chunks, offset = [], 0
        while offset < before.st_size:
            chunk = os.pread(fd, before.st_size - offset, offset)
            if not chunk:
                break
            chunks.append(chunk)
            offset += len(chunk)
        after = os.fstat(fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    same = _identity(before) == _identity(after) and len(data) == before.st_size
    changed = not same or before.st_ctime >= daemon.since
    return changed, data


def _identity(info):
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def _same_device(path, device):
    try:
        return os.lstat(path).st_dev == device
    except OSError:
        return False
