"""Helpers for the sandbox tests: one event loop per test module, sandboxes started on it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import docker

from terminus_env.sandbox import BASE_IMAGE, Sandbox, SandboxSpec
from terminus_env.sandbox.owner import LABEL, PID_LABEL

T = TypeVar("T")
Runner = Callable[[Awaitable[T]], T]
SPEC = SandboxSpec(BASE_IMAGE)


def event_loop_runner() -> Iterator[Runner]:
    """A runner bound to one loop: a sandbox only works on the loop that started it."""
    loop = asyncio.new_event_loop()
    try:
        yield loop.run_until_complete
    finally:
        loop.close()


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
