"""Connecting to the Docker engine, with one clear error when none answers."""

from __future__ import annotations

import docker
from docker.errors import DockerException

from terminus_env.sandbox.errors import DockerUnavailable


def connect(client: docker.DockerClient | None = None) -> docker.DockerClient:
    """Return ``client`` (or one from the environment) after checking the engine answers."""
    try:
        if client is None:
            client = docker.from_env(timeout=120)
        client.ping()
    except DockerException as exc:
        raise DockerUnavailable(str(exc)) from exc
    except OSError as exc:  # requests wraps most, but not all, socket errors
        raise DockerUnavailable(str(exc)) from exc
    return client
