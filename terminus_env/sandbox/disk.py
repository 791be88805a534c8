"""The disk limit's watch: one thread per Docker engine measures the writable layers of every sandbox this process
holds there, all at once, every ``DISK_POLL_S``.

Asking Docker for each sandbox's size every second cost about 6 ms of host CPU per idle sandbox per second (this
process and dockerd together; docs/notes/fleet.md). Here a round reads the layers' upper folders directly, where this
process can (a local engine, and the right to read its data root), and asks Docker nothing; the layers it cannot read
cost one ``containers(size=True)`` call per round for all of them. Both count what Docker's ``SizeRw`` counts: the
sizes of the layer's files, each hard-linked file once.

Where the engine enforces a size (overlay2 on xfs with ``pquota``, see ``scripts/sandbox-host-xfs.sh``), each layer
gets a hard limit ``HARD_LIMIT_HEADROOM_MB`` above ``storage_mb``: the agent's writes stop there, yet a layer can be
seen past ``storage_mb`` and is judged as on any other engine, and one file up to the limit still meets the per-file
cap first. There the kernel keeps the count: one ``statvfs`` of the layer reads its project quota's use, whatever the
layer holds (files deleted while held open included).

The limit fails closed: a layer whose size cannot be had by any of these ways counts as over its limit
(:class:`Unmeasured`), never as 0: Docker 20.10 answers ``SizeRw`` -1 for a layer holding a path longer than
PATH_MAX, and a layer read as 0 there would grow without end.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import docker
from docker.errors import APIError, DockerException

from terminus_env.sandbox.errors import SandboxError
from terminus_env.sandbox.layer_diff import LayerFolders
from terminus_env.sandbox.owner import LABEL, PID_LABEL

DISK_POLL_S = 1.0
HARD_LIMIT_HEADROOM_MB = 1
"""Where the engine enforces sizes: how far above ``storage_mb`` a layer's hard limit is."""
_MB = 1024 * 1024
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Layer:
    """One sandbox's writable layer, as the watch measures it."""

    container_id: str
    engine: str
    """The engine's ID (``docker info``): the watch it belongs to."""
    limit_mb: int
    enforced: bool
    """Whether the engine holds the layer to a hard limit (``limit_mb + HARD_LIMIT_HEADROOM_MB``)."""
    upper_dir: str | None
    """The layer's folder on this machine, as Docker reports it (overlay2's UpperDir); None: only Docker can tell."""
    folders: LayerFolders | None = None
    """The layer's and the image's folders on this machine, where the grade reads the changes itself."""


@dataclass(frozen=True)
class Unmeasured:
    """A layer whose size could be had neither by walking it nor from Docker; it counts as over its limit."""

    why: str
    """What failed, for the episode's error."""


Use = int | Unmeasured
"""A layer's use: its bytes, or why it could not be measured."""


def over_limit(used: Use, limit_mb: int) -> bool:
    """Whether a layer broke its limit of ``limit_mb``: past it, not at it. A layer that could not be measured has
    broken it: read as 0, it could grow without end."""
    return isinstance(used, Unmeasured) or used > limit_mb * _MB


def engine_use(entry: Mapping[str, Any]) -> Use:
    """A layer's use from Docker's listing of its container (``containers(size=True)``). Docker leaves ``SizeRw`` out
    when it is 0 (``SizeRootFs``, the image's files and the layer's, then shows it measured) and answers -1 where its
    own walk failed (Docker 20.10: a path longer than PATH_MAX); anything but a size is unmeasured, never 0."""
    size, total = entry.get("SizeRw"), entry.get("SizeRootFs")
    if "SizeRw" not in entry and isinstance(total, int) and total > 0:
        return 0
    if isinstance(size, int) and not isinstance(size, bool) and size >= 0:
        return size
    return Unmeasured(f"Docker reported its size as {size!r}" if "SizeRw" in entry else "Docker reported no size")


OnOver = Callable[[Use], None]
"""Called once, from the watch's thread, with the use of a layer that broke its limit."""


class DiskWatch:
    """The layers of this process's sandboxes on one engine; a thread measures them while there are any."""

    def __init__(self, client: docker.DockerClient, interval_s: float = DISK_POLL_S) -> None:
        self._client = client
        self._interval_s = interval_s
        self._layers: dict[str, tuple[Layer, OnOver]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._engine_measures = False

    def add(self, layer: Layer, on_over: OnOver) -> None:
        """Watch ``layer`` until it breaks its limit (``on_over`` is called, once) or is removed."""
        with self._lock:
            self._layers[layer.container_id] = (layer, on_over)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="terminus-env-disk-watch", daemon=True)
                self._thread.start()

    def remove(self, container_id: str) -> None:
        with self._lock:
            self._layers.pop(container_id, None)

    @property
    def watched(self) -> int:
        with self._lock:
            return len(self._layers)

    def measure(self, layer: Layer) -> Use | None:
        """What ``layer`` holds now (blocking), or None when its container is gone. Raises DockerException (or
        OSError) when Docker had to be asked and did not answer."""
        used, ask = _measure_here([layer])
        if ask:
            used = _engine_uses(self._client, ask)
        return used.get(layer.container_id)

    def measure_all(self, layers: list[Layer]) -> dict[str, Use]:
        """The use per container id, for the layers that still exist: walked where this process can, one call to
        Docker for the rest (left out when the engine does not answer at all: the next round asks again)."""
        used, ask = _measure_here(layers)
        if ask:
            try:
                uses = _engine_uses(self._client, ask)
            except (DockerException, OSError):
                uses = {}
            used.update((container_id, uses[container_id]) for container_id in ask if container_id in uses)
        return used

    def check_engine(self, layer: Layer) -> None:
        """Before the agent's first turn, once per engine, that Docker can measure a layer this process cannot walk:
        on an engine that reports no sizes every episode would end ``resource_limit``, blamed on the agent. Raises
        SandboxError, saying what to do."""
        if layer.upper_dir is not None or self._engine_measures:
            return
        try:
            used = self.measure(layer)
        except (DockerException, OSError) as exc:
            raise SandboxError(f"cannot measure sandbox {layer.container_id[:12]}'s disk use: {exc}") from exc
        if isinstance(used, Unmeasured):
            raise SandboxError(
                f"Docker cannot measure a new sandbox's writable layer ({used.why}), so the task's storage limit "
                "cannot be held; run the sandboxes where this process can read Docker's data root (a local engine, "
                "as root) or on a storage driver that reports container sizes (`docker ps --size`)"
            )
        self._engine_measures = used is not None

    def _run(self) -> None:
        while True:
            with self._lock:
                watched = dict(self._layers)
                if not watched:
                    self._thread = None
                    return
            for container_id, used in self.measure_all([layer for layer, _ in watched.values()]).items():
                layer, on_over = watched[container_id]
                if over_limit(used, layer.limit_mb):
                    with self._lock:
                        reported = self._layers.pop(container_id, None) is not None
                    if reported:
                        on_over(used)
            time.sleep(self._interval_s)


_watches: dict[tuple[int, str], DiskWatch] = {}
_watches_lock = threading.Lock()


def disk_watch(client: docker.DockerClient, engine: str) -> DiskWatch:
    """This process's watch of the engine ``engine`` (its ID), which ``client`` talks to; a forked child gets its
    own. The first client of an engine serves the watch's calls to it."""
    key = (os.getpid(), engine)
    with _watches_lock:
        watch = _watches.get(key)
        if watch is None:
            watch = _watches[key] = DiskWatch(client)
        return watch


def _engine_uses(client: docker.DockerClient, container_ids: list[str]) -> dict[str, Use]:
    """The containers' use as Docker measures it: one call, for one of them or for every sandbox this process owns
    there. An engine that refuses the listing (a newer Docker fails it on a size it cannot take) is asked once per
    container, so one layer's failure is that layer's: Unmeasured. Raises DockerException (or OSError) when the
    engine does not answer at all."""
    if len(container_ids) == 1:
        filters: dict[str, object] = {"id": container_ids}
    else:
        filters = {"label": [LABEL, f"{PID_LABEL}={os.getpid()}"]}
    try:
        found = client.api.containers(all=True, size=True, filters=filters)
    except APIError as exc:
        if len(container_ids) > 1:
            return {key: use for one in container_ids for key, use in _engine_uses(client, [one]).items()}
        return {container_ids[0]: Unmeasured(f"Docker answered {exc.explanation or exc}")}
    return {entry["Id"]: engine_use(entry) for entry in found}


def readable_layer(upper_dir: str | None) -> str | None:
    """``upper_dir`` if this process can walk it (a local engine, and the right to read its data root), else None."""
    if not upper_dir:
        return None
    try:
        os.close(os.open(upper_dir, _OPEN_DIR))
    except OSError:
        return None
    return upper_dir


def _measure_here(layers: list[Layer]) -> tuple[dict[str, Use], list[str]]:
    """Bytes per container id of the layers this machine can measure (gone ones left out), and the ids of the
    layers only Docker can measure."""
    used: dict[str, Use] = {}
    ask: list[str] = []
    for layer in layers:
        try:
            size = _local_use(layer)
        except FileNotFoundError:
            continue  # the container is gone with its layer; its channel says so
        if size is None:
            ask.append(layer.container_id)
        else:
            used[layer.container_id] = size
    return used, ask


def _local_use(layer: Layer) -> int | None:
    """The layer's use as this machine sees it: its quota's count where the kernel keeps one, else a walk; None when
    only Docker can tell. FileNotFoundError when the layer is gone."""
    if not layer.upper_dir:
        return None
    if layer.enforced:
        used = _quota_use(layer.upper_dir, layer.limit_mb + HARD_LIMIT_HEADROOM_MB)
        if used is not None:
            return used
    return _walk(layer.upper_dir)


def _quota_use(folder: str, quota_mb: int) -> int | None:
    """Bytes counted against ``folder``'s project quota of ``quota_mb``, where ``statvfs`` reports that quota as the
    folder's size (xfs does, for a folder under a project quota with pquota on); None where it reports otherwise."""
    try:
        info = os.statvfs(folder)
    except FileNotFoundError:
        raise
    except OSError:
        return None
    if abs(info.f_blocks * info.f_frsize - quota_mb * _MB) > _MB:
        return None  # the file system's own size: no quota of this layer's size is reported here
    return (info.f_blocks - info.f_bfree) * info.f_frsize


MAX_OPEN_FOLDERS = 32
"""The most folders a walk holds open at once, one per level of the path it is on: deeper, it closes the shallowest
and comes back up through ``..``, so a nest of any depth is measured with a bounded number of descriptors."""


_Level = tuple[int, Iterator[str], tuple[int, int]]
"""One folder on the walk's path: its descriptor (-1 once closed), its subfolders left to walk, and, once closed,
its identity (device, inode), to know that the folder ``..`` leads back to is this one."""
_UNKNOWN: tuple[int, int] = (0, 0)  # the identity of a level still open: not needed yet


def _walk(root: str) -> int | None:
    """The sizes of the files under ``root``, each inode once, as Docker's ``SizeRw`` counts them, never following a
    link the agent made: each folder is opened relative to its parent, refusing links, and at most
    MAX_OPEN_FOLDERS at once whatever the depth. FileNotFoundError when ``root`` is gone; None when it cannot be
    read or a folder moved during the walk: Docker is asked then."""
    try:
        top = os.open(root, _OPEN_DIR)
    except FileNotFoundError:
        raise
    except OSError:
        return None
    seen: set[int] = set()
    path: list[_Level] = [(top, iter(()), _UNKNOWN)]
    shallowest_open = 0  # the open levels are path[shallowest_open:]
    try:
        total, folders = _read_folder(top, seen)
        path[0] = (top, iter(folders), _UNKNOWN)
        while path:
            folder, pending, _ = path[-1]
            name = next(pending, None)
            if name is None:
                path.pop()
                try:
                    if path and shallowest_open == len(path):  # the parent was closed: open it again, from here
                        _, names, ident = path[-1]
                        path[-1] = (_parent(folder, ident), names, _UNKNOWN)
                        shallowest_open -= 1
                finally:
                    os.close(folder)
                continue
            try:
                child = os.open(name, _OPEN_DIR, dir_fd=folder)
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                    continue  # removed, or replaced by a file or a link, since it was listed
                raise
            path.append((child, iter(()), _UNKNOWN))
            if len(path) - shallowest_open > MAX_OPEN_FOLDERS:
                shallow, names, _ = path[shallowest_open]
                info = os.fstat(shallow)
                os.close(shallow)
                path[shallowest_open] = (-1, names, (info.st_dev, info.st_ino))
                shallowest_open += 1
            size, folders = _read_folder(child, seen)
            total += size
            path[-1] = (child, iter(folders), _UNKNOWN)
    except OSError:
        return None  # e.g. out of file descriptors, or a folder moved
    finally:
        for folder, _, _ in path:
            if folder >= 0:
                os.close(folder)
    return total


def _parent(folder: int, ident: tuple[int, int]) -> int:
    """The open folder ``folder``'s parent, opened again; OSError if it is not the folder ``ident`` (the agent moved
    a folder meanwhile: the walk's count would not be the layer's)."""
    parent = os.open("..", _OPEN_DIR, dir_fd=folder)
    info = os.fstat(parent)
    if (info.st_dev, info.st_ino) != ident:
        os.close(parent)
        raise OSError(errno.ESTALE, "a folder of the layer moved while it was walked")
    return parent


def _read_folder(folder: int, seen: set[int]) -> tuple[int, list[str]]:
    """The sizes of the files in one open folder (hard links counted once, via ``seen``), and its subfolders."""
    size = 0
    folders = []
    with os.scandir(folder) as entries:
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(info.st_mode):
                folders.append(entry.name)
            elif info.st_nlink == 1:
                size += info.st_size
            elif info.st_ino not in seen:
                seen.add(info.st_ino)
                size += info.st_size
    return size, folders
