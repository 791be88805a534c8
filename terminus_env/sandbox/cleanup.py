"""Removing this process's containers (episode networks, channel folders) when it exits: at interpreter exit and on
SIGTERM.

This is process-wide state by nature (one interpreter, one exit), so it lives in one registry.
SIGINT needs no handler: Python turns it into KeyboardInterrupt, the interpreter unwinds and
the atexit hook runs. SIGTERM normally kills Python without running atexit, so a handler is
installed, but only where none is set (a user's or asyncio's handler is left alone).
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import docker
from docker.errors import APIError, DockerException, NotFound

NETWORK_REMOVE_S = 15.0
"""How long removing an episode's network waits for its containers' removal to finish."""


class _Registry:
    def __init__(self) -> None:
        self._live: dict[str, docker.DockerClient] = {}
        self._networks: dict[str, docker.DockerClient] = {}
        self._folders: set[Path] = set()
        self._lock = threading.Lock()
        self._hooked = False
        self._reaped = False

    def hook(self) -> None:
        """Register the exit hooks once; call from the thread that runs the event loop (signals need main)."""
        with self._lock:
            if self._hooked:
                return
            self._hooked = True
        atexit.register(self.remove_all)
        _install_sigterm(self._on_sigterm)

    def add(self, container_id: str, client: docker.DockerClient) -> None:
        with self._lock:
            self._live[container_id] = client

    def discard(self, container_id: str) -> None:
        with self._lock:
            self._live.pop(container_id, None)

    def add_network(self, name: str, client: docker.DockerClient) -> None:
        with self._lock:
            self._networks[name] = client

    def discard_network(self, name: str) -> None:
        with self._lock:
            self._networks.pop(name, None)

    def add_folder(self, path: Path) -> None:
        with self._lock:
            self._folders.add(path)

    def discard_folder(self, path: Path) -> None:
        with self._lock:
            self._folders.discard(path)

    def claim_reap(self) -> bool:
        """True exactly once per process: the first sandbox runs the reaper."""
        with self._lock:
            first, self._reaped = not self._reaped, True
            return first

    def remove_all(self) -> None:
        """Every container, then every network (which Docker removes only once no container is on it) and
        folder."""
        with self._lock:
            live, self._live = self._live, {}
            networks, self._networks = self._networks, {}
            folders, self._folders = self._folders, set()
        for container_id, client in live.items():
            remove_container(client, container_id)
        for name, client in networks.items():
            remove_network(client, name)
        for path in folders:
            shutil.rmtree(path, ignore_errors=True)

    def _on_sigterm(self, signum: int, frame: object) -> None:
        self.remove_all()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def _install_sigterm(handler: signal.Handlers | object) -> None:
    try:
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, handler)  # type: ignore[arg-type]
    except ValueError:  # not the main thread: rely on atexit
        pass


def remove_container(client: docker.DockerClient, container_id: str) -> bool:
    """Force-remove a container; True if this call removed it. Gone already is fine."""
    try:
        client.api.remove_container(container_id, force=True)
    except NotFound:
        return False
    except APIError as exc:
        if exc.status_code == 409:  # auto-removal already in progress
            return False
        raise
    except DockerException:
        return False
    return True


def remove_network(client: docker.DockerClient, name: str, wait_s: float = NETWORK_REMOVE_S) -> bool:
    """Remove a network, waiting up to ``wait_s`` for containers being removed to leave it; True if this call
    removed it. Gone already is fine; one still in use after ``wait_s`` is left to the reaper."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            client.api.remove_network(name)
        except NotFound:
            return False
        except APIError as exc:
            if "active endpoints" not in str(exc) or time.monotonic() > deadline:
                return False
            time.sleep(0.2)
            continue
        except DockerException:
            return False
        return True


REGISTRY = _Registry()
