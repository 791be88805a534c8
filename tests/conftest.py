"""Shared fixtures. Docker tests skip without an engine, but fail under TERMINUS_REQUIRE_DOCKER=1 (CI)."""

from __future__ import annotations

import pytest

from terminus_env.config import REQUIRE_DOCKER, env_flag


def _docker_problem() -> str | None:
    try:
        import docker

        client = docker.from_env(timeout=10)
        client.ping()
        client.close()
    except Exception as exc:  # any failure to reach the engine
        return f"no Docker engine answers ({exc})"
    return None


@pytest.fixture(scope="session")
def docker_required() -> None:
    """Depend on this in every test that needs a real Docker engine."""
    problem = _docker_problem()
    if problem is None:
        return
    if env_flag(REQUIRE_DOCKER, False):
        pytest.fail(f"{problem}; {REQUIRE_DOCKER}=1 makes this a failure, not a skip")
    pytest.skip(problem)
