"""Local images: the Debian base image every shipped task builds on, and per-task images.

No registry is reachable where terminus-env usually runs, so the base image can be made
from nothing with debootstrap; task images are tagged by a hash of their build context so
an unchanged task never rebuilds.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Generator, Iterable, Mapping
from contextlib import closing
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import IO

import docker
import requests
from docker.errors import APIError, BuildError, DockerException, ImageNotFound

from terminus_env import config
from terminus_env.config import ConfigError
from terminus_env.sandbox import buildkit
from terminus_env.sandbox.builders import Builder, BuilderChoice, builder_setting, choose_builder, failure_reason
from terminus_env.sandbox.docker_client import connect
from terminus_env.sandbox.errors import ImageBuildError
from terminus_env.utils.process_group import end_group
from terminus_env.utils.sidecars import Sidecar

BASE_IMAGE = "terminus-env/base:bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = (
    "bash", "tmux", "python3", "python3-pytest", "procps", "coreutils",
    "ca-certificates", "less", "nano", "curl", "findutils", "grep", "sed",
)  # fmt: skip
IMAGE_LABEL = "terminus-env.image"
# pip byte-compiles every .py file it installs, the shipped suite's included: those caches are no part of a task.
BYTECODE_DIR = "__pycache__"
CONTEXT_LABEL = "terminus-env.context"
"""On task images: the build context folder it was built from, so prune can tell whose image it is."""
TASK_REPOSITORY = "terminus-env/task-"
_LOG_TAIL_LINES = 30
STOP_WAIT_S = 30.0  # for what debootstrap started to be gone once killed
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
    _run_build(client, tag, tag, docker.utils.mkbuildcontext(io.BytesIO(dockerfile.encode())), timeout=1800,
               recipe=dockerfile)  # fmt: skip


def _debootstrap_and_import(client: docker.DockerClient, tag: str, mirror: str, log: Callable[[str], None]) -> None:
    if os.geteuid() != 0:
        raise ImageBuildError(tag, "debootstrap needs root: run `sudo terminus-env images base`")
    if shutil.which("debootstrap") is None:
        raise ImageBuildError(tag, "debootstrap is not installed: run `apt-get install debootstrap`, then retry")
    tmp = Path(tempfile.mkdtemp(prefix="terminus-rootfs-"))
    still_running = False
    try:
        rootfs = tmp / "rootfs"
        command = [
            "debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
            "bookworm", str(rootfs), mirror,
        ]  # fmt: skip
        log(f"running {' '.join(command)} (a few minutes)")
        returncode, output = _run_whole(command, tag)
        if returncode != 0:
            raise ImageBuildError(tag, f"debootstrap exited with {returncode}", _tail(output))
        _unmount_below(rootfs)
        shutil.rmtree(rootfs / "var/cache/apt/archives", ignore_errors=True)
        shutil.rmtree(rootfs / "var/lib/apt/lists", ignore_errors=True)
        archive = tmp / "rootfs.tar"
        subprocess.run(["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(archive), "."], check=True)
        repository, _, version = tag.rpartition(":")
        log(f"importing the root file system as {tag}")
        try:
            client.api.import_image(src=str(archive), repository=repository, tag=version, changes=_ROOTFS_CHANGES)
        except APIError as exc:
            raise ImageBuildError(tag, f"docker import failed: {exc}") from exc
        if not _image_exists(client, tag):
            raise ImageBuildError(tag, "docker import reported success but the image is missing")
    except _StillRunning:
        still_running = True
        raise
    finally:
        # Only once nothing of debootstrap runs and nothing is mounted below it: an aborted run can leave the
        # host's /proc, /sys or /dev/shm mounted in the target, and removing the folder would descend into them.
        mounted = _unmount_below(tmp)
        if mounted:
            raise ImageBuildError(tag, f"{', '.join(mounted)} still mounted: unmount, then remove {tmp}")
        if not still_running:
            shutil.rmtree(tmp)


def _run_whole(command: list[str], tag: str) -> tuple[int, str]:
    """Run ``command`` (building ``tag``) in a session of its own; its exit status and output. However this ends
    (Ctrl-C included), nothing of it is left running: debootstrap's dpkg and chroot children would otherwise go on
    writing into the folder that is removed next."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)  # fmt: skip
    try:
        output, _ = process.communicate()
    finally:
        left = end_group(process.pid, STOP_WAIT_S)
        process.wait()
        if left:  # over an interruption too: what they write into is not removed
            raise _StillRunning(tag, f"{command[0]}'s processes {left} outlived SIGKILL for {STOP_WAIT_S:.0f} s")
    return process.returncode, output


class _StillRunning(ImageBuildError):
    """What a build started did not die when killed; the folder it writes into stays."""


def _unmount_below(root: Path) -> list[str]:
    """Unmount (lazily) whatever is mounted below ``root``: debootstrap mounts /proc, /sys and, in a container, the
    host's /dev entries in its target, and an aborted run leaves them. The mount points still there after."""
    for target in reversed(_mounts_below(root)):
        subprocess.run(["umount", "-l", target], capture_output=True, check=False)
    return _mounts_below(root)


def _mounts_below(root: Path) -> list[str]:
    prefix = str(root) + "/"
    points = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    return [point for point in points if point.startswith(prefix)]


def ensure_image(
    context_dir: Path, name: str, build_timeout: float = 600, client: docker.DockerClient | None = None, *,
    dockerfile: str = "Dockerfile", args: Iterable[tuple[str, str]] = (),
) -> str:  # fmt: skip
    """Build (or reuse) the image of a build context (its ``dockerfile``, with build ``args``); the tag holds a hash
    of the context, the parent images and the recipe."""
    context_dir = Path(context_dir)
    recipe = context_dir / dockerfile
    if not recipe.is_file():
        raise ImageBuildError(name, f"no {dockerfile} in {context_dir}: add one or point at the right folder")
    client = connect(client)
    text = recipe.read_text(errors="replace")
    parents = _from_images(text)
    if base_image_tag() in parents:
        ensure_base_image(client=client)
    args = tuple(args)
    hashed = context_hash(context_dir, _local_image_ids(client, parents), _recipe(dockerfile, args))
    tag = f"{TASK_REPOSITORY}{slug(name)}:{hashed}"
    if _image_exists(client, tag):
        return tag
    context = str(context_dir.resolve())
    with context_tar(context_dir, dockerfile) as archive:
        _run_build(client, tag, name, archive, build_timeout, dockerfile=dockerfile, args=dict(args),
                   labels={CONTEXT_LABEL: context}, recipe=text)  # fmt: skip
    _untag_replaced(client, tag, context)
    return tag


def ensure_prebuilt(reference: str, client: docker.DockerClient | None = None) -> str | None:
    """Make a prebuilt image present: None when it is (here already, or pulled now), else why it is not."""
    client = connect(client)
    if _image_exists(client, reference):
        return None
    repository, tag = _split_reference(reference)
    try:
        client.images.pull(repository, tag=tag)
    except DockerException as exc:
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return None if _image_exists(client, reference) else "the pull ended without the image"


def ensure_sidecar_image(sidecar: Sidecar, client: docker.DockerClient | None = None) -> str:
    """The image a sidecar runs: its build context built (or reused), or its named image present or pulled."""
    if sidecar.build is not None:
        build = sidecar.build
        return ensure_image(
            build.context, build.name, build.timeout_s, client, dockerfile=build.dockerfile, args=build.args
        )
    reference = sidecar.image or ""
    problem = ensure_prebuilt(reference, client)
    if problem is not None:
        raise ImageBuildError(
            sidecar.name, f"image {reference!r} of {sidecar.label} is not here and cannot be pulled ({problem}); "
            "load or build it locally (`docker load`, `docker build -t ...`), or give the service a build context"
        )  # fmt: skip
    return reference


def _split_reference(reference: str) -> tuple[str, str]:
    """(repository, tag or digest) of an image reference; the tag is "latest" when none is written."""
    if "@" in reference:
        repository, digest = reference.split("@", 1)
        return repository, digest
    name, colon, tag = reference.rpartition(":")
    if colon and "/" not in tag:
        return name, tag
    return reference, "latest"


def context_tar(context_dir: Path, dockerfile: str = "Dockerfile") -> IO[bytes]:
    """The build context as a tar: what docker-py would send (honouring .dockerignore, keeping the Dockerfile), less
    bytecode caches. BuildKit tells a tar from a bare Dockerfile by its first 1,024 bytes, so the Dockerfile comes
    first and mtimes are whole seconds (Python gives a fractional one a PAX header of its own, before the file)."""
    ignore_file = context_dir / ".dockerignore"
    lines = ignore_file.read_text(errors="replace").splitlines() if ignore_file.is_file() else []
    patterns = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
    names = docker.utils.exclude_paths(str(context_dir), [*patterns, f"**/{BYTECODE_DIR}"], dockerfile=dockerfile)
    archive = tempfile.NamedTemporaryFile()  # noqa: SIM115 - the caller closes it (it is what it gets)
    with tarfile.open(mode="w", fileobj=archive) as tar:
        for name in sorted(names, key=lambda name: (name != dockerfile, name)):
            tar.add(context_dir / name, arcname=name, recursive=False, filter=_whole_seconds)
    archive.seek(0)
    return archive


def _whole_seconds(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mtime = int(info.mtime)
    return info


def slug(name: str) -> str:
    """A lowercase name valid as a Docker repository component."""
    value = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return value[:100] or "task"


def context_hash(context_dir: Path, parent_ids: Iterable[str] = (), recipe: str = "") -> str:
    """A hash of every path, mode and byte in the build context, of the parent images' ids and of ``recipe`` (a
    Dockerfile other than the default, build arguments) in 16 hex digits: a rebuilt base image means rebuilt
    task images."""
    digest = hashlib.sha256()
    if recipe:
        digest.update(f"R {recipe}\0".encode())
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


def _run_build(
    client: docker.DockerClient, tag: str, name: str, archive: IO[bytes], timeout: float, *,
    dockerfile: str = "Dockerfile", args: Mapping[str, str] | None = None, labels: Mapping[str, str] | None = None,
    recipe: str = "",
) -> None:  # fmt: skip
    """Build ``archive`` (a build context's tar) into ``tag`` with BuildKit where the engine has it, else with the
    classic builder; give up after ``timeout`` seconds. A failure names the builder, why that one, and the log's
    tail; ``recipe`` (the Dockerfile's text) lets it say what to change."""
    version = _engine_version(client, name)
    try:
        choice = choose_builder(builder_setting(), version)
    except ConfigError as exc:
        raise ImageBuildError(name, str(exc)) from exc
    engine = str(version.get("Version", "of unknown version"))
    labels = {IMAGE_LABEL: "1", **(labels or {})}
    if choice.builder is Builder.BUILDKIT:
        params = {"t": tag, "dockerfile": dockerfile, "labels": json.dumps(labels), "buildargs": json.dumps(args or {})}
        try:
            _follow(client, tag, name, buildkit.start_build(client, archive, params, timeout), timeout,
                    lambda error: failure_reason(choice, error, recipe, engine))  # fmt: skip
            return
        except buildkit.BuildkitRefused as exc:
            choice = BuilderChoice(Builder.CLASSIC, f"the engine refused a BuildKit build: {exc}")
            archive.seek(0)
    classic = _classic_build(client, tag, archive, timeout, dockerfile=dockerfile, args=args or {}, labels=labels)
    _follow(client, tag, name, classic, timeout, lambda error: failure_reason(choice, error, recipe, engine))


def _classic_build(
    client: docker.DockerClient, tag: str, archive: IO[bytes], timeout: float, *, dockerfile: str,
    args: Mapping[str, str], labels: Mapping[str, str],
) -> Generator[dict, None, None]:  # fmt: skip
    """The classic builder's messages; the request goes out when the first one is asked for."""
    yield from client.api.build(
        fileobj=archive, custom_context=True, tag=tag, dockerfile=dockerfile, buildargs=dict(args), rm=True,
        forcerm=True, decode=True, labels=dict(labels), timeout=timeout,
    )  # fmt: skip


def _engine_version(client: docker.DockerClient, name: str) -> Mapping[str, object]:
    try:
        return client.version()
    except (DockerException, requests.RequestException) as exc:
        raise ImageBuildError(name, f"the engine stopped answering ({exc})") from exc


def _follow(
    client: docker.DockerClient, tag: str, name: str, messages: Generator[dict, None, None], timeout: float,
    reason: Callable[[str], str],
) -> None:  # fmt: skip
    """Read a build's messages (either builder's) into a log, until the image is there or the build fails."""
    log = buildkit.BuildLog()
    deadline = time.monotonic() + timeout
    try:
        with closing(messages):
            for message in messages:
                if message.get("id") == buildkit.TRACE:
                    log.feed(message.get("aux"))
                elif "stream" in message:
                    log.lines.extend(str(message["stream"]).splitlines())
                if "error" in message:
                    log.flush()
                    raise ImageBuildError(name, reason(str(message["error"]).strip()), _tail(log.text()))
                if time.monotonic() > deadline:
                    raise ImageBuildError(name, f"the build took longer than {timeout:g} s", _tail(log.text()))
    except (APIError, BuildError) as exc:
        raise ImageBuildError(name, reason(str(exc)), _tail(log.text())) from exc
    except (DockerException, requests.RequestException) as exc:
        raise ImageBuildError(name, f"the engine stopped answering ({exc})", _tail(log.text())) from exc
    if not _image_exists(client, tag):
        raise ImageBuildError(name, "the build ended without producing the image", _tail(log.text()))


def _tail(text: str) -> str:
    return "\n".join(text.strip().splitlines()[-_LOG_TAIL_LINES:])


# --- pruning task images -------------------------------------------------------------------------


@dataclass(frozen=True)
class PruneReport:
    removed: tuple[str, ...] = ()
    """Tags removed (or, in a dry run, that would be)."""
    in_use: tuple[str, ...] = ()
    """Stale tags kept because a container still uses their image."""
    undecided: tuple[str, ...] = ()
    """Tags of tasks whose current tag cannot be told (a task that does not load, a missing parent image)."""


def current_task_tag(
    context_dir: Path, name: str, client: docker.DockerClient | None = None, *, dockerfile: str = "Dockerfile",
    args: Iterable[tuple[str, str]] = (),
) -> str | None:  # fmt: skip
    """The tag `ensure_image` gives this build context now, without building; None when a parent image is
    missing locally, since the tag depends on the parent's id."""
    context_dir = Path(context_dir)
    client = connect(client)
    parents = _from_images((context_dir / dockerfile).read_text(errors="replace"))
    ids = _local_image_ids(client, parents)
    if len(ids) < len(parents - _stage_names(context_dir / dockerfile) - {"scratch"}):
        return None
    return f"{TASK_REPOSITORY}{slug(name)}:{context_hash(context_dir, ids, _recipe(dockerfile, tuple(args)))}"


def _recipe(dockerfile: str, args: tuple[tuple[str, str], ...]) -> str:
    """What a tag must hash besides the context: a Dockerfile other than the default, and build arguments."""
    return "" if dockerfile == "Dockerfile" and not args else f"{dockerfile}\0{sorted(args)}"


def prune_task_images(
    current: Mapping[str, str | None],
    roots: Iterable[Path],
    *,
    client: docker.DockerClient | None = None,
    dry_run: bool = False,
) -> PruneReport:
    """Remove the task images that no task in ``roots`` needs any more.

    ``current`` maps the name of every task folder in ``roots`` to the tag it needs now (None: cannot
    tell, so its images are kept). A tag is removed when its image was built from a folder in
    ``roots`` (the context label) and is not its task's current tag, or its folder is no longer a
    task. Images built before the label existed are matched by task name instead. Images built from
    anywhere else, the base image, and images a container uses are never removed.
    """
    client = connect(client)
    roots = [Path(r).resolve() for r in roots]
    needed = {tag for tag in current.values() if tag is not None}
    by_slug = {slug(name): tag for name, tag in current.items()}
    removed, in_use, undecided = [], [], []
    for image in client.api.images(filters={"label": IMAGE_LABEL}):
        context = (image.get("Labels") or {}).get(CONTEXT_LABEL)
        for tag in image.get("RepoTags") or []:
            if not tag.startswith(TASK_REPOSITORY) or tag in needed or tag == base_image_tag():
                continue
            task_slug = tag[len(TASK_REPOSITORY) :].rpartition(":")[0]
            verdict = _verdict(context, task_slug, roots, current, by_slug)
            if verdict is _Verdict.UNDECIDED:
                undecided.append(tag)
            elif verdict is _Verdict.STALE and (dry_run or _untag(client, tag)):
                removed.append(tag)
            elif verdict is _Verdict.STALE:
                in_use.append(tag)
    return PruneReport(tuple(sorted(removed)), tuple(sorted(in_use)), tuple(sorted(undecided)))


class _Verdict(Enum):
    NOT_OURS = "not ours"
    UNDECIDED = "undecided"
    STALE = "stale"


def _verdict(
    context: str | None, task_slug: str, roots: list[Path], current: Mapping[str, str | None],
    by_slug: Mapping[str, str | None],
) -> _Verdict:  # fmt: skip
    """Whose image a tag is, and whether its task still needs it (the current tags are already kept)."""
    if context is None:  # built before images recorded their folder: go by the task's name
        if task_slug not in by_slug:
            return _Verdict.NOT_OURS
        return _Verdict.UNDECIDED if by_slug[task_slug] is None else _Verdict.STALE
    for root in roots:
        try:
            task = Path(context).relative_to(root).parts[0]
        except (ValueError, IndexError):
            continue
        if task in current and current[task] is None:
            return _Verdict.UNDECIDED
        return _Verdict.STALE  # an older tag of a current task, or the image of a task folder now gone
    return _Verdict.NOT_OURS


def _untag_replaced(client: docker.DockerClient, tag: str, context: str) -> None:
    """After a rebuild, drop the task's older tags built from the same folder, so they do not pile up."""
    repository = tag.rpartition(":")[0]
    for image in client.api.images(name=repository, filters={"label": f"{CONTEXT_LABEL}={context}"}):
        for old in image.get("RepoTags") or []:
            if old != tag and old.rpartition(":")[0] == repository:
                _untag(client, old)


def _untag(client: docker.DockerClient, tag: str) -> bool:
    """Remove a tag (the image too, once no tag is left); False when a container still uses the image."""
    try:
        client.api.remove_image(tag)
    except ImageNotFound:
        return True
    except APIError as exc:
        if exc.status_code == 409:
            return False
        raise
    return True


def _stage_names(dockerfile: Path) -> set[str]:
    """``FROM x AS name`` stage names, which later FROM lines may use and are no images."""
    text = dockerfile.read_text(errors="replace")
    return {m.group(1) for m in re.finditer(r"(?im)^\s*FROM\s+(?:--\S+\s+)*\S+\s+AS\s+(\S+)", text)}
