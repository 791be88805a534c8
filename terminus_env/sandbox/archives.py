"""The tar archives that carry files into a container (Docker's put_archive takes a tar), owned by root."""

from __future__ import annotations

import io
import tarfile
import time
from pathlib import Path, PurePosixPath


def tar_dir(local: Path, dest: str) -> bytes:
    """A tar of folder ``local``'s contents under ``dest``, owned by root."""
    buffer = io.BytesIO()
    root = PurePosixPath("/", dest).relative_to("/")
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path in sorted(local.rglob("*")):
            archive.add(path, arcname=str(root / path.relative_to(local).as_posix()), recursive=False, filter=_root)
    return buffer.getvalue()


def tar_file(data: bytes, dest: str, mode: int) -> bytes:
    """A tar holding one file ``dest`` with ``data``, owned by root."""
    buffer = io.BytesIO()
    info = tarfile.TarInfo(str(PurePosixPath("/", dest).relative_to("/")))
    info.size, info.mode, info.mtime = len(data), mode, int(time.time())
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _root(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info
