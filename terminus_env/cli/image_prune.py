"""`terminus-env images prune`: which task images the tasks in some folders still need, and the rest removed.

The folders decide: a task folder that loads needs the tag its build context hashes to now; one
that does not load keeps all its images (it may be fixed); a task image built from one of these
folders and needed by none of their tasks goes. Images built from other folders are left alone,
so pruning one checkout never removes what another checkout on the same engine is using.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from terminus_env.tasks.loader import is_task_dir, load_task, shipped_tasks_dir
from terminus_env.tasks.task import TaskError


def current_tags(folders: Sequence[Path]) -> dict[str, str | None]:
    """Every task folder's name mapped to the tag it needs now; None when that cannot be told. Each sidecar a task
    builds adds its own entry, under its image's name (``<task>-<service>``); a task whose sidecar's tag cannot be
    told is undecided as a whole."""
    from terminus_env.sandbox.images import current_task_tag

    needed: dict[str, str | None] = {}
    for folder in folders:
        if not Path(folder).is_dir():
            raise TaskError(f"{folder}: not a folder of tasks")
        for path in sorted(p for p in Path(folder).iterdir() if p.is_dir() and is_task_dir(p)):
            try:
                task = load_task(path)
            except TaskError:
                needed[path.name] = None  # broken now, maybe fixed tomorrow: keep its images
                continue
            context = task.build_context
            needed[task.name] = None if context is None else current_task_tag(context, task.name)
            for sidecar in task.services.sidecars if task.services is not None else ():
                if sidecar.build is None:
                    continue
                build = sidecar.build
                needed[build.name] = current_task_tag(build.context, build.name, dockerfile=build.dockerfile,
                                                      args=build.args)  # fmt: skip
                if needed[build.name] is None:
                    needed[task.name] = None
    return needed


def prune_images(folders: Sequence[Path], *, dry_run: bool = False) -> int:
    """Print what was removed and what was kept; the exit code is 0."""
    from terminus_env.sandbox.images import prune_task_images

    folders = list(folders) or [shipped_tasks_dir()]
    report = prune_task_images(current_tags(folders), folders, dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    for tag in report.removed:
        print(f"{verb} {tag}")
    for tag in report.in_use:
        print(f"kept {tag}: a container still uses it", file=sys.stderr)
    for tag in report.undecided:
        print(f"kept {tag}: its task does not load, or a parent image is missing", file=sys.stderr)
    print(f"{verb} {len(report.removed)} task image tag(s); kept {len(report.in_use) + len(report.undecided)} "
          "that may still be needed")  # fmt: skip
    return 0
