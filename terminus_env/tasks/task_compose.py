"""A task's compose file as each harness finds and reads it: which file, with which variables, and what it means
for the task.

Harbor reads ``environment/docker-compose.yaml`` with its own variables (``CONTEXT_DIR``, ``CPUS``, ...);
Terminal-Bench 1 reads ``docker-compose.yaml`` at the task's top with its ``T_BENCH_*`` variables. Neither reads a
compose file by another name. The loader asks once per task; ``terminus_env.tasks.compose`` reads the file itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from terminus_env.tasks.compose import HARBOR_MAIN, ComposeEnvironment, read_compose
from terminus_env.tasks.task import TaskError

COMPOSE_FILE = "docker-compose.yaml"
"""The one compose file both harnesses read: Harbor's in ``environment/`` (``harbor.environments.definition``
0.26.0: ``COMPOSE_FILE_NAME``), Terminal-Bench 1's at the task's top (``TaskPaths.docker_compose_path``)."""
UNREAD_COMPOSE_NAMES = ("docker-compose.yml", "compose.yaml", "compose.yml")
"""Names Docker Compose would read, but neither harness does: such a file is data in the build context (one real
task ships a deliberately broken ``docker-compose.yml`` for the agent to fix)."""
TB1_MAIN = "client"


@dataclass(frozen=True)
class TaskCompose:
    """All a task's compose file means for loading it: what it sets (``environment``; the defaults when the task
    has none) and a note for each file by another compose name that is not read."""

    environment: ComposeEnvironment = ComposeEnvironment()
    notes: tuple[str, ...] = ()

    def task_fields(self) -> dict[str, Any]:
        """The Task fields only a compose file sets."""
        compose = self.environment
        return {
            "pids_limit": compose.pids_limit, "shm_size_mb": compose.shm_size_mb, "tmpfs": compose.tmpfs,
            "extra_hosts": compose.extra_hosts, "services": compose.services,
        }  # fmt: skip


def read_harbor_compose(
    environment_dir: Path, task_name: str, *, prebuilt: bool, cpus: float | None, memory_mb: int | None,
    host: Mapping[str, str], build_timeout_s: float,
) -> TaskCompose:  # fmt: skip
    """A Harbor task's ``environment/docker-compose.yaml``, with Harbor's variables over the host's. Refuses an
    environment given only as a compose file (no Dockerfile, and no prebuilt image)."""
    notes = unread_compose_notes(environment_dir, "Harbor")
    file = environment_dir / COMPOSE_FILE
    if not file.is_file():
        return TaskCompose(notes=notes)
    if not prebuilt and not (environment_dir / "Dockerfile").is_file():
        raise TaskError(
            f"{file}: an environment given only as a compose file (no environment/Dockerfile and no "
            "[environment] docker_image) is not supported: terminus-env builds the agent's container from "
            "environment/Dockerfile and runs the compose file's other services beside it"
        )
    variables = {**host, **harbor_variables(task_name, environment_dir, cpus, memory_mb)}
    environment = read_compose(
        file, main=HARBOR_MAIN, main_build=environment_dir, variables=variables, image_prefix=task_name,
        build_timeout_s=build_timeout_s,
    )  # fmt: skip
    return TaskCompose(environment, notes)


def read_tb1_compose(task_dir: Path, *, host: Mapping[str, str], build_timeout_s: float) -> TaskCompose:
    """A Terminal-Bench 1 task's ``docker-compose.yaml``, with the harness's variables over the host's."""
    notes = unread_compose_notes(task_dir, "Terminal-Bench 1")
    file = task_dir / COMPOSE_FILE
    if not file.is_file():
        return TaskCompose(notes=notes)
    variables = {**host, **tb1_variables(task_dir.name)}
    environment = read_compose(
        file, main=TB1_MAIN, main_build=None, variables=variables, image_prefix=task_dir.name,
        build_timeout_s=build_timeout_s,
    )  # fmt: skip
    return TaskCompose(environment, notes)


def unread_compose_notes(folder: Path, harness: str) -> tuple[str, ...]:
    """A note for each file beside the task's compose file that Docker Compose would read and ``harness`` does not."""
    return tuple(
        f"{folder / name} is not read as a compose file ({harness} reads only {COMPOSE_FILE}): it is a file like any "
        "other in the build context"
        for name in UNREAD_COMPOSE_NAMES
        if (folder / name).is_file()
    )


def tb1_variables(task_name: str) -> dict[str, str]:
    """What Terminal-Bench 1's harness sets for its compose files (names and folders; the mounts are ignored)."""
    prefix = f"tb__{task_name}"
    return {
        "T_BENCH_TASK_DOCKER_CLIENT_IMAGE_NAME": f"{prefix}__client",
        "T_BENCH_TASK_DOCKER_CLIENT_CONTAINER_NAME": f"{prefix}__client",
        "T_BENCH_TASK_DOCKER_NAME_PREFIX": prefix,
        "T_BENCH_TEST_DIR": "/tests",
        "T_BENCH_CONTAINER_LOGS_PATH": "/logs",
        "T_BENCH_CONTAINER_AGENT_LOGS_PATH": "/agent-logs",
    }


def harbor_variables(
    task_name: str, environment_dir: Path, cpus: float | None, memory_mb: int | None
) -> dict[str, str]:
    """What Harbor sets for the compose files of a task (names, folders and limits; the mounts are ignored)."""
    variables = {
        "CONTEXT_DIR": str(environment_dir),
        "MAIN_IMAGE_NAME": f"hb__{task_name}",
        "ENV_VERIFIER_LOGS_PATH": "/logs/verifier",
        "ENV_AGENT_LOGS_PATH": "/logs/agent",
        "ENV_ARTIFACTS_PATH": "/logs/artifacts",
    }
    if cpus is not None:
        variables["CPUS"] = f"{cpus:g}"
    if memory_mb is not None:
        variables["MEMORY"] = f"{memory_mb}M"
    return variables
