"""Fixtures and helpers for the sandbox tests: one event loop per test module, sandboxes started on it.

Test modules import the fixtures they use by name."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import docker
import pytest

from terminus_env.sandbox import BASE_IMAGE, Sandbox, SandboxSpec
from terminus_env.sandbox.owner import LABEL, PID_LABEL

T = TypeVar("T")
Runner = Callable[[Awaitable[T]], T]
SPEC = SandboxSpec(BASE_IMAGE)


@pytest.fixture(name="run", scope="module")
def run_fixture(docker_required: None) -> Iterator[Runner]:
    """A runner bound to one loop per module: a sandbox only works on the loop that started it."""
    loop = asyncio.new_event_loop()
    try:
        yield loop.run_until_complete
    finally:
        loop.close()


@pytest.fixture(name="client", scope="module")
def client_fixture(docker_required: None) -> Iterator[docker.DockerClient]:
    """A client of the engine, for a test module to look at what was built or started."""
    client = docker.from_env()
    yield client
    client.close()


@pytest.fixture(name="sandbox", scope="module")
def sandbox_fixture(run: Runner) -> Iterator[Sandbox]:
    """One default sandbox shared by a module's tests."""
    yield from sandbox_on(run)


def sandbox_on(run: Runner, spec: SandboxSpec = SPEC) -> Iterator[Sandbox]:
    sandbox = run(Sandbox.start(spec))
    try:
        yield sandbox
    finally:
        run(sandbox.close())


def containers_of_pid(pid: int) -> list[str]:
    client = docker.from_env()
    try:
        found = client.api.containers(all=True, filters={"label": [LABEL, f"{PID_LABEL}={pid}"]})
    finally:
        client.close()
    return [item["Id"] for item in found]


def remove_tags(client: docker.DockerClient, prefix: str) -> None:
    """Untag a test's images named ``prefix...`` (never by id: an id may carry other tags); one in use stays."""
    for image in client.images.list(name=f"{prefix}*"):
        for tag in image.tags:
            if tag.startswith(prefix):
                try:
                    client.images.remove(tag)
                except docker.errors.APIError:
                    pass
