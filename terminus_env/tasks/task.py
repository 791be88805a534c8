"""The `Task` record: everything needed to build, run and grade one terminal task.

A `Task` is format-neutral; `loader` turns Harbor and Terminal-Bench 1 folders into it,
and `grading` and the environment read only this record, never the files' formats.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, Protocol

from terminus_env.errors import TerminusError
from terminus_env.utils.sidecars import Services

if TYPE_CHECKING:
    from terminus_env.sandbox import SandboxSpec

SourceFormat = Literal["harbor", "terminal-bench-1"]

# Harbor sets no agent limit by default; a sandbox still needs one to reclaim containers.
UNBOUNDED_AGENT_TIMEOUT_S = 4 * 3600.0
_LIFETIME_MARGIN_S = 600.0


class TaskError(TerminusError, ValueError):
    """A task folder cannot be used as written; the message names the file and the field to fix."""


@dataclass(frozen=True)
class Task:
    """One task, read from disk. Paths are absolute; timeouts are seconds."""

    name: str
    instruction: str
    path: Path
    source_format: SourceFormat
    tests_dir: Path
    verifier_script: Path
    """Run as the verifier: Harbor's ``tests/test.sh`` or Terminal-Bench 1's ``run-tests.sh``."""
    solution_path: Path | None
    """Harbor's ``solution/solve.sh`` (its folder is copied whole) or Terminal-Bench 1's ``solution.sh``."""
    build_context: Path | None
    docker_image: str | None = None
    agent_timeout_s: float | None = None
    verifier_timeout_s: float = 600.0
    build_timeout_s: float = 600.0
    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    allow_internet: bool = True
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str | None = None
    agent_user: str | None = None
    verifier_env: Mapping[str, str] = field(default_factory=dict)
    verifier_user: str | None = None
    solution_env: Mapping[str, str] = field(default_factory=dict)
    """The reference solution's environment (Harbor's ``[solution] env``)."""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    """What the loader could not honour (e.g. a solution.yaml), for the user to read."""
    pids_limit: int | None = None
    shm_size_mb: int | None = None
    tmpfs: tuple[tuple[str, str], ...] = ()
    extra_hosts: tuple[tuple[str, str], ...] = ()
    services: Services | None = None
    """The compose file's other services (sidecars), started beside the agent's container in every episode."""

    def __post_init__(self) -> None:
        for name in ("env", "verifier_env", "solution_env", "metadata"):  # frozen all the way down to the first level
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))

    @property
    def difficulty(self) -> str | None:
        value = self.metadata.get("difficulty")
        return None if value is None else str(value)

    @property
    def category(self) -> str | None:
        value = self.metadata.get("category")
        return None if value is None else str(value)

    @property
    def agent_time_limit_s(self) -> float:
        """The agent's limit, with a finite stand-in when the task sets none."""
        return self.agent_timeout_s if self.agent_timeout_s is not None else UNBOUNDED_AGENT_TIMEOUT_S

    def sandbox_spec(self, image: str) -> SandboxSpec:
        """The container this task's episodes run in, built from `image` (see `task_image`)."""
        from terminus_env.sandbox import SandboxSpec

        episode = self.agent_time_limit_s + self.verifier_timeout_s + _LIFETIME_MARGIN_S
        lifetime = self.build_timeout_s + episode
        return SandboxSpec(
            image=image,
            cpus=self.cpus,
            memory_mb=self.memory_mb,
            storage_mb=self.storage_mb,
            allow_internet=self.allow_internet,
            env=dict(self.env),
            workdir=self.workdir,
            user=self.agent_user,
            lifetime_s=max(lifetime, 4 * 3600.0),
            life_needed_s=episode,
            pids_limit=SandboxSpec.pids_limit if self.pids_limit is None else self.pids_limit,
            shm_size_mb=self.shm_size_mb,
            tmpfs=self.tmpfs,
            extra_hosts=self.extra_hosts,
            services=self.services,
        )


class ImageBuilder(Protocol):
    """Builds a task's image where its sandboxes run: a sandbox pool (a Ray pool builds on the chosen node)."""

    async def build_image(self, context_dir: Path, name: str, build_timeout_s: float) -> str: ...


async def task_image(task: Task, builder: ImageBuilder | None = None) -> str:
    """The image tag to start this task from, once every image its episodes need is here.

    A prebuilt ``docker_image`` is used when present locally or pullable; otherwise the build context is built (or
    reused) by ``builder`` (a sandbox pool: a Ray pool builds on the node it picks), or by this machine's Docker
    engine without one. The sidecars' images are built (or pulled) here, on this machine, so a broken one fails
    here, not in every episode.
    """
    from terminus_env.sandbox import ImageBuildError, ensure_image, ensure_prebuilt, ensure_sidecar_image

    if task.services is not None:
        for sidecar in task.services.sidecars:
            await asyncio.to_thread(ensure_sidecar_image, sidecar)
    if task.docker_image is not None:
        problem = await asyncio.to_thread(ensure_prebuilt, task.docker_image)
        if problem is None:
            return task.docker_image
        if task.build_context is None:
            raise ImageBuildError(
                task.name, f"its prebuilt image {task.docker_image!r} is not here and cannot be pulled ({problem}); "
                "load or build it locally, or add environment/Dockerfile to build from"
            )  # fmt: skip
    if task.build_context is None:
        raise TaskError(f"{task.path}: task has neither a build context nor [environment] docker_image")
    if builder is not None:
        return await builder.build_image(task.build_context, task.name, task.build_timeout_s)
    return await asyncio.to_thread(ensure_image, task.build_context, task.name, task.build_timeout_s)
