"""Lay out the corpus of public tasks (bench/corpus/corpus.toml) in a work folder, adapted to this offline machine.

The public tasks come from snapshots fetched with the search tool's `fetch` (git directories under /work/.mirror);
no fetched file is kept in the repository. The corpus's own tasks (`repo = "ours"`) live in bench/corpus/ours. For
each task: its folder (at the listed commit) is copied out, then the corpus's edits are applied and recorded in the
task's `adaptations.json`. The wheels the tasks install are downloaded with pip on the host, and the corpus base
image is built if it is missing.

    python bench/corpus/materialise.py [--out .corpus] [--mirror /work/.mirror] [--name X ...] [--rebuild-base]

Exits 2, saying which snapshot to fetch, when one is missing.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

HERE = Path(__file__).resolve().parent
CORPUS_FILE = HERE / "corpus.toml"
BASE_CONTEXT = HERE / "base"
OURS_DIR = HERE / "ours"
OURS = "ours"
"""The `repo` of the corpus's own tasks: small tasks in the shape of public ones that could not be had here."""
DEFAULT_OUT = HERE.parent.parent / ".corpus"
DEFAULT_MIRROR = Path("/work/.mirror")
DOCKERFILES = ("environment/Dockerfile", "Dockerfile")
"""Where Harbor (environment/) and Terminal-Bench 1 (the task's root) keep the task's Dockerfile."""
AT_LEAST_ONE = -1
WHEEL_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
                   "any")  # fmt: skip
"""What the containers' Debian bookworm (glibc 2.36, x86_64) installs."""
_FROM = re.compile(r"^FROM\s+(?:--platform=\S+\s+)?(?P<image>\S+)", re.MULTILINE)


@dataclass(frozen=True)
class Edit:
    file: str
    pattern: str
    replace: str
    count: int | None
    """How many matches the edit must find: AT_LEAST_ONE, an exact number, or None for any number (none too)."""


@dataclass(frozen=True)
class CorpusTask:
    name: str
    repo: str
    commit: str
    path: str
    classes: tuple[str, ...]
    edits: tuple[Edit, ...] = ()


@dataclass(frozen=True)
class Corpus:
    base_image: str
    wheels: tuple[tuple[str, ...], ...]
    edits: tuple[Edit, ...]
    tasks: tuple[CorpusTask, ...] = field(default=())
    host_env: dict[str, str] = field(default_factory=dict)
    """Host variables that tasks' `${VAR}` templates need; run.py sets them where unset."""
    base_workdirs: dict[str, str] = field(default_factory=dict)
    """Image-name prefix -> the WORKDIR that base image sets, which the task's Dockerfile relies on: written after
    the FROM that replaces it."""


class MissingSnapshot(Exception):
    """A task's repository (or its commit) is not among the fetched snapshots."""


def load_corpus(path: Path = CORPUS_FILE) -> Corpus:
    data = tomllib.loads(path.read_text())
    defaults = data["defaults"]
    tasks = tuple(
        CorpusTask(t["name"], t["repo"], t.get("commit", ""), t["path"], tuple(t.get("classes", ())),
                   tuple(_edit(e) for e in t.get("edits", ())))
        for t in data["task"]
    )  # fmt: skip
    names = [t.name for t in tasks]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: task names repeat: {sorted({n for n in names if names.count(n) > 1})}")
    edits = tuple(_edit(e) for e in defaults.get("edits", ()))
    wheels = tuple(tuple(w) for w in defaults.get("wheels", ()))
    return Corpus(defaults["base_image"], wheels, edits, tasks, dict(defaults.get("host_env", {})),
                  dict(defaults.get("base_workdirs", {})))  # fmt: skip


def _edit(raw: dict) -> Edit:
    count = raw.get("count", AT_LEAST_ONE)
    return Edit(raw["file"], raw["pattern"], raw["replace"], None if count == "any" else int(count))


def snapshot_dir(mirror: Path, repo: str) -> Path:
    return mirror / repo.replace("/", "+") / "repo"


def export_task(task: CorpusTask, mirror: Path, dest: Path) -> None:
    """Copy the task's folder at its commit out of the fetched snapshot (or out of bench/corpus/ours) into `dest`,
    emptied first."""
    if dest.exists():
        shutil.rmtree(dest)
    if task.repo == OURS:
        source = OURS_DIR / task.path
        if not source.is_dir():
            raise MissingSnapshot(f"{task.name}: no folder {source}")
        shutil.copytree(source, dest)
        return
    git_dir = snapshot_dir(mirror, task.repo)
    if not git_dir.is_dir():
        raise MissingSnapshot(f"{task.name}: no snapshot of {task.repo} at {git_dir}; fetch it with the search "
                              f"tool (`fetch github:{task.repo}`), then run this again")  # fmt: skip
    has = subprocess.run(["git", "--git-dir", str(git_dir), "cat-file", "-e", f"{task.commit}^{{commit}}"],
                         capture_output=True, check=False)  # fmt: skip
    if has.returncode != 0:
        raise MissingSnapshot(f"{task.name}: the snapshot of {task.repo} lacks commit {task.commit}; fetch a newer "
                              "snapshot, or pin the task to a commit it has")  # fmt: skip
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "--git-dir", str(git_dir), "archive", "--format=tar", task.commit, task.path],
                             capture_output=True, check=True).stdout  # fmt: skip
    prefix = task.path.rstrip("/") + "/"
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        members = []
        for member in tar.getmembers():
            if not member.name.startswith(prefix):
                continue
            member.name = member.name[len(prefix) :]
            members.append(member)
        if not members:
            raise MissingSnapshot(f"{task.name}: {task.repo}@{task.commit[:12]} has no folder {task.path}")
        tar.extractall(dest, members=members, filter="data")


def adapt(task: CorpusTask, corpus: Corpus, folder: Path) -> list[dict]:
    """Apply the corpus's edits to the task in `folder`, then point every FROM at the corpus base; return what was
    changed, for adaptations.json."""
    applied: list[dict] = []
    for edit in (*corpus.edits, *task.edits):
        target = folder / edit.file
        if not target.is_file():
            if edit.count is None:
                continue
            raise ValueError(f"{task.name}: edit of {edit.file} ({edit.pattern!r}): the task has no such file")
        text = target.read_text()
        new, n = re.subn(edit.pattern, edit.replace, text, flags=re.MULTILINE)
        if edit.count is not None and (n == 0 if edit.count == AT_LEAST_ONE else n != edit.count):
            want = "at least one match" if edit.count == AT_LEAST_ONE else f"{edit.count} match(es)"
            raise ValueError(f"{task.name}: edit of {edit.file} ({edit.pattern!r}) found {n}, wants {want}: "
                             "the upstream file changed, so review the edit")  # fmt: skip
        if n:
            target.write_text(new)
            applied.append({"file": edit.file, "pattern": edit.pattern, "replace": edit.replace, "matches": n})
    for name in DOCKERFILES:
        dockerfile = folder / name
        if dockerfile.is_file():
            new, n = _FROM.subn(lambda match: _base_from(corpus, match["image"]), dockerfile.read_text())
            dockerfile.write_text(new)
            applied.append({"file": name, "edit": f"every FROM -> {corpus.base_image}", "matches": n})
    return applied


def _base_from(corpus: Corpus, image: str) -> str:
    """The FROM line that replaces one of `image`, and the WORKDIR that image would have set."""
    workdir = next((w for prefix, w in corpus.base_workdirs.items() if image.startswith(prefix)), None)
    return f"FROM {corpus.base_image}" + (f"\nWORKDIR {workdir}" if workdir else "")


def download_wheels(corpus: Corpus, wheels_dir: Path) -> None:
    """pip on the host fetches what the tasks install, for the containers' Python (3.11, x86_64)."""
    wheels_dir.mkdir(parents=True, exist_ok=True)
    for group in corpus.wheels:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "-d", str(wheels_dir), "--only-binary=:all:",
             "--python-version", "3.11", *(f"--platform={tag}" for tag in WHEEL_PLATFORMS), *group],
            check=True,
        )  # fmt: skip


def build_base(corpus: Corpus, out: Path, rebuild: bool) -> None:
    """The corpus base image, from bench/corpus/base and the downloaded wheels, unless it exists."""
    present = subprocess.run(["docker", "image", "inspect", corpus.base_image], capture_output=True, check=False)
    if present.returncode == 0 and not rebuild:
        return
    context = out / "base"
    if context.exists():
        shutil.rmtree(context)
    shutil.copytree(BASE_CONTEXT, context)
    shutil.copytree(out / "wheels", context / "wheels")
    print(f"building {corpus.base_image} (a few minutes)", flush=True)
    subprocess.run(["docker", "build", "-q", "-t", corpus.base_image, str(context)], check=True)


def materialise(out: Path, mirror: Path, names: list[str] | None = None, rebuild_base: bool = False) -> list[Path]:
    corpus = load_corpus()
    chosen = [t for t in corpus.tasks if not names or t.name in names]
    unknown = sorted(set(names or ()) - {t.name for t in corpus.tasks})
    if unknown:
        raise ValueError(f"no corpus task named {', '.join(unknown)}")
    missing = [t for t in chosen if t.repo != OURS and not snapshot_dir(mirror, t.repo).is_dir()]
    if missing:
        repos = sorted({t.repo for t in missing})
        raise MissingSnapshot("missing snapshots: " + ", ".join(repos) + f" (under {mirror}); fetch each with the "
                              "search tool (`fetch github:OWNER/NAME`), then run this again")  # fmt: skip
    download_wheels(corpus, out / "wheels")
    build_base(corpus, out, rebuild_base)
    folders = []
    for task in chosen:
        folder = out / "tasks" / task.name
        export_task(task, mirror, folder)
        applied = adapt(task, corpus, folder)
        record = {"name": task.name, "repo": task.repo, "commit": task.commit, "path": task.path,
                  "classes": list(task.classes), "adaptations": applied}  # fmt: skip
        (folder / "adaptations.json").write_text(json.dumps(record, indent=2) + "\n")
        folders.append(folder)
        where = f"bench/corpus/ours/{task.path}" if task.repo == OURS else f"{task.repo}@{task.commit[:12]}:{task.path}"
        print(f"{task.name}: {where} ({len(applied)} edits)", flush=True)
    return folders


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="work folder (default: .corpus)")
    parser.add_argument("--mirror", type=Path, default=DEFAULT_MIRROR, help="where fetched snapshots live")
    parser.add_argument("--name", action="append", help="only this task (repeatable)")
    parser.add_argument("--rebuild-base", action="store_true", help="rebuild the corpus base image")
    args = parser.parse_args(argv)
    try:
        folders = materialise(args.out, args.mirror, args.name, args.rebuild_base)
    except MissingSnapshot as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{len(folders)} tasks in {args.out / 'tasks'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
