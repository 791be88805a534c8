"""What the agent's side changed in a container, before its verifier runs: the paths of the writable layer, and for
the few paths the judge asks about, whether the image had them (modified) or not (added).

Where this machine can read the layer's own folders (overlay2 on a local engine, as root), the upper folder is
walked through descriptors, never a path, so no depth or name length stops it, and the image's lower folders answer
whether a path existed; that takes milliseconds where Docker's diff took hundreds. Elsewhere Docker's diff answers.
Either way, a layer that cannot be inspected because of what is in it is the agent's doing (``BrokenByAgent``): the
grade never stands on a layer it could not see.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import docker
from docker.errors import DockerException

from terminus_env.sandbox.errors import BrokenByAgent, SandboxError
from terminus_env.sandbox.tamper import Change

MAX_ENTRIES = 2_000_000
"""Entries of a writable layer the walk reads before it gives up (the agent's doing: ``BrokenByAgent``)."""
MAX_DEPTH = 256
"""Folders deeper than this in the writable layer are not listed: nothing a runtime looks up by name lies there."""
MAX_TOUCHED = 200_000
"""Changed paths (with the folders above them) sent to the daemon at most, for it to leave out of what it reuses."""
_OPAQUE = "trusted.overlay.opaque"
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class LayerFolders:
    """A container's overlay folders on this machine: the writable ``upper`` and the image's ``lowers``, top first."""

    upper: str
    lowers: tuple[str, ...]

    @classmethod
    def of(cls, graph_driver: Mapping[str, object]) -> LayerFolders | None:
        """From a container's ``GraphDriver`` (``docker inspect``), if overlay2 and readable here; else None."""
        data = graph_driver.get("Data") if graph_driver.get("Name") == "overlay2" else None
        if not isinstance(data, Mapping):
            return None
        upper, lower = data.get("UpperDir"), data.get("LowerDir")
        if not isinstance(upper, str) or not isinstance(lower, str):
            return None
        folders = cls(upper, tuple(path for path in lower.split(":") if path))
        try:
            for folder in (folders.upper, *folders.lowers):
                os.close(os.open(folder, _DIR))
        except OSError:
            return None
        return folders


@dataclass(frozen=True)
class LayerDiff:
    """The paths the agent's side changed (added, modified or deleted), and how each differs from the image for the
    paths that are asked (``kind``)."""

    paths: tuple[str, ...]
    links: tuple[str, ...] = ()
    """The paths that are links (where Docker made the diff, every path: the daemon tells which are links)."""
    folders: LayerFolders | None = None
    kinds: Mapping[str, Change] = field(default_factory=dict)
    """Docker's answer, where Docker made the diff."""

    _index: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", frozenset(self.paths))

    def __contains__(self, path: object) -> bool:
        return path in self._index

    def touched(self, limit: int = MAX_TOUCHED) -> tuple[str, ...] | None:
        """Every changed path and every folder above one, sorted; None past ``limit`` (too many to send: whoever
        asks must then treat the whole layer as changed)."""
        out = set(self.paths)
        for path in self.paths:
            parent = path.rsplit("/", 1)[0]
            while parent and parent not in out:
                out.add(parent)
                parent = parent.rsplit("/", 1)[0]
            if len(out) > limit:
                return None
        return tuple(sorted(out))

    def kinds_of(self, paths: Iterable[str]) -> dict[str, Change]:
        """How each of ``paths`` that the layer lists differs from the image."""
        out: dict[str, Change] = {}
        for path in paths:
            if path not in self:
                continue
            if self.folders is None:
                out[path] = self.kinds[path]
            else:
                out[path] = _kind(self.folders, path)
        return out


def layer_diff(client: docker.DockerClient, container_id: str, folders: LayerFolders | None) -> LayerDiff:
    """The container's changes: walked here when ``folders`` are readable, else Docker's diff.

    Raises ``BrokenByAgent`` when the layer cannot be inspected because of what it holds (more than MAX_ENTRIES
    entries, or Docker's diff fails while Docker answers everything else), ``SandboxError`` when Docker fails."""
    if folders is not None:
        try:
            listed = list(walk_upper(folders.upper))
            return LayerDiff(tuple(path for path, _ in listed), tuple(path for path, link in listed if link), folders)
        except FileNotFoundError as exc:
            raise SandboxError(f"the writable layer of sandbox {container_id[:12]} is gone: {exc}") from exc
    kinds = {0: Change.MODIFIED, 1: Change.ADDED, 2: Change.DELETED}
    try:
        entries: list[dict[str, Any]] = client.api.diff(container_id) or []
    except DockerException as exc:
        try:
            client.api.inspect_container(container_id)
        except DockerException:
            raise SandboxError(f"cannot compare sandbox {container_id[:12]} with its image: {exc}") from exc
        # Docker answers, and the container is there: what stopped its diff is in the layer the agent wrote.
        raise BrokenByAgent(f"Docker could not list the sandbox's writable layer ({exc}): the agent's files stop "
                            "the grade from inspecting the container") from exc  # fmt: skip
    paths = tuple(entry["Path"] for entry in entries)
    return LayerDiff(paths, paths, None, {entry["Path"]: kinds[entry["Kind"]] for entry in entries})


def walk_upper(upper: str) -> Iterable[tuple[str, bool]]:
    """Every path in the writable layer as the container names it (whiteouts included: deleted paths), and whether
    it is a link, through
    descriptors, depth first with one open folder per level: no recursion, no path length limit. Raises
    ``BrokenByAgent`` past MAX_ENTRIES entries."""
    root = os.open(upper, _DIR)
    stack: list[tuple[int, str, Iterator[tuple[str, bool, bool]]]] = []
    try:
        stack.append((root, "", iter(_listing(root))))
    except BaseException:
        os.close(root)
        raise
    seen = 0
    try:
        while stack:
            fd, prefix, names = stack[-1]
            entry = next(names, None)
            if entry is None:
                os.close(fd)
                stack.pop()
                continue
            name, is_dir, is_link = entry
            seen += 1
            if seen > MAX_ENTRIES:
                raise BrokenByAgent(f"the sandbox's writable layer holds more than {MAX_ENTRIES:,} entries: the "
                                    "agent's files stop the grade from inspecting the container")  # fmt: skip
            path = f"{prefix}/{name}"
            yield path, is_link
            if not is_dir or len(stack) > MAX_DEPTH:
                continue
            try:
                child = os.open(name, _DIR, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                    continue  # gone or replaced meanwhile: the agent's processes still run
                raise
            try:
                stack.append((child, path, iter(_listing(child))))
            except BaseException:
                os.close(child)
                raise
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def _listing(fd: int) -> list[tuple[str, bool, bool]]:
    with os.scandir(fd) as entries:
        return [(entry.name, entry.is_dir(follow_symlinks=False), entry.is_symlink()) for entry in entries]


def _kind(folders: LayerFolders, path: str) -> Change:
    """Whether the image had ``path`` (modified), had not (added), or the layer deleted it."""
    try:
        info = _lstat_in(folders.upper, path)
    except OSError:
        info = None
    if info is not None and stat.S_ISCHR(info.st_mode) and info.st_rdev == 0:
        return Change.DELETED  # an overlay whiteout
    return Change.MODIFIED if in_image(folders.lowers, path) else Change.ADDED


def in_image(lowers: Iterable[str], path: str) -> bool:
    """Whether the image's layers (top first) hold ``path``: the topmost layer that has it, a whiteout of it, or an
    opaque folder above it decides."""
    parts = path.strip("/").split("/")
    for lower in lowers:
        try:
            info = _lstat_in(lower, path)
        except OSError:
            info = None
        if info is not None:
            return not (stat.S_ISCHR(info.st_mode) and info.st_rdev == 0)
        if _opaque_above(lower, parts):
            return False
    return False


def _opaque_above(lower: str, parts: list[str]) -> bool:
    for depth in range(1, len(parts)):
        folder = os.path.join(lower, *parts[:depth])
        try:
            if os.getxattr(folder, _OPAQUE, follow_symlinks=False) == b"y":
                return True
        except OSError:
            continue
    return False


def _lstat_in(base: str, path: str) -> os.stat_result:
    """lstat of ``path`` below ``base``, walking one name at a time so that no link on the way is followed."""
    parts = path.strip("/").split("/")
    fd = os.open(base, _DIR)
    try:
        for part in parts[:-1]:
            child = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = child
        return os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
    finally:
        os.close(fd)
