"""Local images: the Debian base image every shipped task builds on, and per-task images.

No registry is reachable where terminus-env usually runs, so the base image can be made
from nothing with debootstrap; task images are tagged by a hash of their build context so
an unchanged task never rebuilds.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO

import docker
import requests
from docker.errors import APIError, BuildError, DockerException, ImageNotFound

from terminus_env import config
from terminus_env.sandbox.docker_client import connect
from terminus_env.sandbox.errors import ImageBuildError

BASE_IMAGE = "terminus-env/base:bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = (
    "bash", "tmux", "python3", "python3-pytest", "procps", "coreutils",
    "ca-certificates", "less", "nano", "curl", "findutils", "grep", "sed",
)  # fmt: skip
IMAGE_LABEL = "terminus-env.image"
# pip byte-compiles every .py file it installs, the shipped suite's included: those caches are no part of a task.
BYTECODE_DIR = "__pycache__"
_LOG_TAIL_LINES = 30
_ROOTFS_CHANGES = [
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    'CMD ["bash"]',
]


def base_image_tag(environ: dict[str, str] | None = None) -> str:
    """The base image's tag: BASE_IMAGE unless TERMINUS_BASE_IMAGE overrides it."""
    return config.env_str(config.BASE_IMAGE, BASE_IMAGE, environ) or BASE_IMAGE


def ensure_base_image(
    force: bool = False,
    client: docker.DockerClient | None = None,
    log: Callable[[str], None] = print,
    *,
    tag: str | None = None,
    mirror: str | None = None,
    try_pull: bool = True,
) -> str:
    """Reuse the base image if present; else build it from debian:bookworm or, offline, with debootstrap."""
    client = connect(client)
    tag = tag or base_image_tag()
    if not force and _image_exists(client, tag):
        return tag
    mirror = mirror or config.env_str(config.DEBIAN_MIRROR, DEFAULT_MIRROR) or DEFAULT_MIRROR
    if try_pull and _pull(client, "debian:bookworm", log):
        _build_from_debian(client, tag, log)
    else:
        _debootstrap_and_import(client, tag, mirror, log)
    log(f"built {tag}")
    return tag


def _image_exists(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
    except ImageNotFound:
        return False
    return True


def _pull(client: docker.DockerClient, ref: str, log: Callable[[str], None]) -> bool:
    try:
        client.images.pull(ref)
    except DockerException as exc:
        log(f"cannot pull {ref} ({str(exc).splitlines()[0]}); building the base image with debootstrap instead")
        return False
    return True


def _build_from_debian(client: docker.DockerClient, tag: str, log: Callable[[str], None]) -> None:
    dockerfile = (
        "FROM debian:bookworm\n"
        "RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "
        f"{' '.join(BASE_PACKAGES)} && rm -rf /var/lib/apt/lists/*\n"
        "ENV LANG=C.UTF-8\n"
    )
    log(f"building {tag} from debian:bookworm")
    _run_build(client, tag, tag, {"fileobj": io.BytesIO(dockerfile.encode())}, timeout=1800)


def _debootstrap_and_import(client: docker.DockerClient, tag: str, mirror: str, log: Callable[[str], None]) -> None:
    if os.geteuid() != 0:
        raise ImageBuildError(tag, "debootstrap needs root: run `sudo terminus-env images base`")
    if shutil.which("debootstrap") is None:
        raise ImageBuildError(tag, "debootstrap is not installed: run `apt-get install debootstrap`, then retry")
    with tempfile.TemporaryDirectory(prefix="terminus-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        command = [
            "debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
            "bookworm", str(rootfs), mirror,
        ]  # fmt: skip
        log(f"running {' '.join(command)} (a few minutes)")
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            _unmount_below(rootfs)
            log_tail = _tail(result.stdout + result.stderr)
            raise ImageBuildError(tag, f"debootstrap exited with {result.returncode}", log_tail)
        _unmount_below(rootfs)
        shutil.rmtree(rootfs / "var/cache/apt/archives", ignore_errors=True)
        shutil.rmtree(rootfs / "var/lib/apt/lists", ignore_errors=True)
        archive = Path(tmp) / "rootfs.tar"
        subprocess.run(["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(archive), "."], check=True)
        repository, _, version = tag.rpartition(":")
        log(f"importing the root file system as {tag}")
        try:
            client.api.import_image(src=str(archive), repository=repository, tag=version, changes=_ROOTFS_CHANGES)
        except APIError as exc:
            raise ImageBuildError(tag, f"docker import failed: {exc}") from exc
        if not _image_exists(client, tag):
            raise ImageBuildError(tag, "docker import reported success but the image is missing")


def _unmount_below(root: Path) -> None:
    """debootstrap mounts /proc and /sys in the target; an aborted run can leave them mounted."""
    mounts = Path("/proc/mounts").read_text().splitlines()
    for line in reversed(mounts):
        target = line.split()[1]
        if target.startswith(str(root) + "/"):
            subprocess.run(["umount", "-l", target], capture_output=True, check=False)


def ensure_image(
    context_dir: Path, name: str, build_timeout: float = 600, client: docker.DockerClient | None = None
) -> str:
    """Build (or reuse) the image of a task's build context; the tag holds a hash of the context."""
    context_dir = Path(context_dir)
    dockerfile = context_dir / "Dockerfile"
    if not dockerfile.is_file():
        raise ImageBuildError(name, f"no Dockerfile in {context_dir}: add one or point at the right folder")
    client = connect(client)
    parents = _from_images(dockerfile.read_text(errors="replace"))
    if base_image_tag() in parents:
        ensure_base_image(client=client)
    tag = f"terminus-env/task-{slug(name)}:{context_hash(context_dir, _local_image_ids(client, parents))}"
    if _image_exists(client, tag):
        return tag
    with context_tar(context_dir) as context:
        _run_build(client, tag, name, {"fileobj": context, "custom_context": True}, timeout=build_timeout)
    return tag


def context_tar(context_dir: Path) -> IO[bytes]:
    """The build context as docker-py sends it (honouring .dockerignore), less bytecode caches."""
    ignore_file = context_dir / ".dockerignore"
    lines = ignore_file.read_text(errors="replace").splitlines() if ignore_file.is_file() else []
    patterns = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
    return docker.utils.tar(str(context_dir), exclude=[*patterns, f"**/{BYTECODE_DIR}"])


def slug(name: str) -> str:
    """A lowercase name valid as a Docker repository component."""
    value = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return value[:100] or "task"


def context_hash(context_dir: Path, parent_ids: Iterable[str] = ()) -> str:
    """A hash of every path, mode and byte in the build context, and of the parent images' ids
    (16 hex digits): a rebuilt base image means rebuilt task images."""
    digest = hashlib.sha256()
    for parent in sorted(parent_ids):
        digest.update(f"P {parent}\0".encode())
    for path in sorted(p for p in context_dir.rglob("*") if BYTECODE_DIR not in p.relative_to(context_dir).parts):
        relative = path.relative_to(context_dir).as_posix()
        if path.is_symlink():
            digest.update(f"L {relative} -> {os.readlink(path)}\0".encode())
        elif path.is_file():
            digest.update(f"F {relative} {path.stat().st_mode & 0o7777:o}\0".encode())
            digest.update(path.read_bytes())
            digest.update(b"\0")
        else:
            digest.update(f"D {relative}\0".encode())
    return digest.hexdigest()[:16]


def _local_image_ids(client: docker.DockerClient, names: Iterable[str]) -> list[str]:
    """Ids of the FROM images present locally (stage names and absent images are skipped)."""
    ids = []
    for name in names:
        try:
            ids.append(client.images.get(name).id)
        except (ImageNotFound, APIError):  # absent, or a multi-stage alias that is no image reference
            continue
    return ids


def _from_images(dockerfile: str) -> set[str]:
    return {m.group(1) for m in re.finditer(r"(?im)^\s*FROM\s+(?:--\S+\s+)*(\S+)", dockerfile)}


def _run_build(client: docker.DockerClient, tag: str, name: str, source: dict, timeout: float) -> None:
    """Stream a build, keep the log's tail for errors, and give up after ``timeout`` seconds."""
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        stream = client.api.build(
            tag=tag, rm=True, forcerm=True, decode=True, labels={IMAGE_LABEL: "1"}, timeout=timeout, **source
        )
        for chunk in stream:
            if "stream" in chunk:
                lines.extend(chunk["stream"].splitlines())
            if "error" in chunk:
                raise ImageBuildError(name, chunk["error"].strip(), _tail("\n".join(lines)))
            if time.monotonic() > deadline:
                stream.close()
                raise ImageBuildError(name, f"the build took longer than {timeout:g} s", _tail("\n".join(lines)))
    except (APIError, BuildError) as exc:
        raise ImageBuildError(name, str(exc), _tail("\n".join(lines))) from exc
    except (DockerException, requests.RequestException) as exc:
        raise ImageBuildError(name, f"the engine stopped answering ({exc})", _tail("\n".join(lines))) from exc
    if not _image_exists(client, tag):
        raise ImageBuildError(name, "the build ended without producing the image", _tail("\n".join(lines)))


def _tail(text: str) -> str:
    return "\n".join(text.strip().splitlines()[-_LOG_TAIL_LINES:])
