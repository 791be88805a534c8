"""An episode's sidecars: a network of its own, and the compose file's other services on it, started in the order
their dependencies ask for, before the main container, and removed after it.

Through the Docker API (docker-py), not the Docker Compose CLI: a fresh machine's engine (Debian's ``docker.io``)
has no compose plugin, the main container must be created by us (its hardening, its split, its control daemon),
and every container must carry the owner labels the reaper and the exit hooks go by.

Sidecars are the task's code, not the agent's: they are not split like the main container, but they are hardened
as far as that does not break them: no-new-privileges; Docker's default capabilities less NET_RAW, MKNOD,
AUDIT_WRITE, SYS_CHROOT, SETFCAP and SETPCAP (a service may add back those of Docker's default set it names);
pids, memory and CPU limits (the sandbox's defaults unless the compose file sets its own); a capped log; and the
owner labels. The network is internal, with no route out, unless the task allows the internet. Service names
(and their hostnames and container names) resolve from the main container through Docker's DNS.
"""

from __future__ import annotations

import asyncio
import threading
import time
from enum import Enum
from typing import Any

import docker
from docker.errors import APIError, DockerException, NotFound
from docker.types import LogConfig

from terminus_env.sandbox.cleanup import REGISTRY, remove_container, remove_network
from terminus_env.sandbox.errors import ImageBuildError, SandboxError
from terminus_env.sandbox.images import ensure_sidecar_image
from terminus_env.sandbox.owner import Owner
from terminus_env.sandbox.spec import CAPABILITIES, DEFAULT_CPUS, DEFAULT_MEMORY_MB, LOG_LIMIT, SandboxSpec
from terminus_env.utils.sidecars import Condition, Dependency, Sidecar

SERVICES_READY_S = 300.0
"""How long the services may take to reach what a container that depends on them waits for."""
SERVICE_LABEL = "terminus-env.service"
"""On each sidecar container: the name of the service it runs."""
DEFAULT_SIDECAR_PIDS = 1024
_POLL_S = 0.25
_LOG_TAIL = 30
_NS_PER_S = 1_000_000_000


class Readiness(Enum):
    WAIT = "wait"
    READY = "ready"
    FAILED = "failed"


def readiness(condition: Condition, state: dict[str, Any]) -> tuple[Readiness, str]:
    """Whether a container in ``state`` (``State`` of ``docker inspect``) meets ``condition``, and if it never
    will, why (a phrase that follows the service's name)."""
    status = state.get("Status")
    code = state.get("ExitCode")
    ended = status in ("exited", "dead")
    if condition is Condition.COMPLETED:
        if ended:
            return (Readiness.READY, "") if code == 0 else (Readiness.FAILED, f"exited with code {code}")
        return Readiness.WAIT, ""
    if ended and (condition is Condition.HEALTHY or code != 0):
        return Readiness.FAILED, f"exited with code {code}"
    if condition is Condition.STARTED:
        return (Readiness.READY, "") if state.get("Running") or ended else (Readiness.WAIT, "")
    health = state.get("Health")
    if not health:
        return Readiness.FAILED, (
            "has no health check (no healthcheck in the compose file, no HEALTHCHECK in its image), so nothing can "
            "wait for it to be healthy"
        )
    if health.get("Status") == "healthy":
        return Readiness.READY, ""
    if health.get("Status") == "unhealthy":
        last = (health.get("Log") or [{}])[-1]
        output = " ".join(str(last.get("Output", "")).split())[-300:]
        return Readiness.FAILED, f"is unhealthy (its last check exited {last.get('ExitCode')}: {output or 'no output'})"
    return Readiness.WAIT, ""


class EpisodeServices:
    """The network and sidecars of one episode. ``start`` them, pass ``main_options`` to the main container's
    creation, and ``remove`` them after it (idempotent; safe from any thread, and while a start is in flight)."""

    def __init__(self, client: docker.DockerClient, spec: SandboxSpec, run: str) -> None:
        if spec.services is None:
            raise ValueError("EpisodeServices needs a spec with services")
        self._client = client
        self._spec = spec
        self._services = spec.services
        self._labels = Owner.current().labels(run)
        self.network = f"terminus-env-{run}"
        self._containers: dict[str, str] = {}  # service name -> container id
        self._lock = threading.Lock()
        self._removed = False
        self._network_made = False

    async def start(self) -> None:
        """The network, then each sidecar once what it depends on holds; returns once what the main container
        depends on holds. Raises SandboxError (with the failing service's output) if something never does."""
        await asyncio.to_thread(self._create_network)
        for sidecar in self._services.start_order():
            await self._wait(sidecar.depends_on, sidecar.label)
            await asyncio.to_thread(self._start_sidecar, sidecar)
        await self._wait(self._services.main_depends_on, f"the agent's container ({self._services.main_name!r})")

    def main_options(self) -> dict[str, Any]:
        """Options of the main container's creation that put it on the network, under its service's names."""
        aliases = [self._services.main_name, *self._services.main_aliases]
        endpoint = self._client.api.create_endpoint_config(aliases=aliases)
        return {"network": self.network, "networking_config": {self.network: endpoint}}

    def remove(self) -> None:
        """Remove every sidecar, then the network (once the main container has left it)."""
        with self._lock:
            self._removed = True
            containers, self._containers = list(self._containers.values()), {}
            network_made, self._network_made = self._network_made, False
        for container_id in containers:
            remove_container(self._client, container_id)
            REGISTRY.discard(container_id)
        if network_made:
            remove_network(self._client, self.network)
            REGISTRY.discard_network(self.network)

    def _create_network(self) -> None:
        with self._lock:
            if self._removed:
                raise SandboxError("the sandbox was closed while its services were starting")
            try:
                self._client.api.create_network(
                    self.network, driver="bridge", internal=not self._spec.allow_internet, labels=self._labels,
                    check_duplicate=True,
                )  # fmt: skip
            except APIError as exc:
                raise SandboxError(_network_problem(exc)) from exc
            self._network_made = True
            REGISTRY.add_network(self.network, self._client)

    def _start_sidecar(self, sidecar: Sidecar) -> None:
        try:
            image = ensure_sidecar_image(sidecar, self._client)
        except ImageBuildError as exc:
            raise SandboxError(f"{sidecar.label} of this task has no image: {exc}") from exc
        with self._lock:
            if self._removed:
                raise SandboxError("the sandbox was closed while its services were starting")
            try:
                container = self._client.containers.create(image, **self._options(sidecar))
            except APIError as exc:
                raise SandboxError(f"cannot create {sidecar.label}: {exc.explanation or exc}") from exc
            self._containers[sidecar.name] = container.id
            REGISTRY.add(container.id, self._client)
        try:
            container.start()
        except APIError as exc:
            raise SandboxError(
                f"cannot start {sidecar.label}: {exc.explanation or exc}{self._output(container.id)}"
            ) from exc

    def _options(self, sidecar: Sidecar) -> dict[str, Any]:
        memory_mb = sidecar.memory_mb or DEFAULT_MEMORY_MB
        options: dict[str, Any] = dict(
            name=f"{self.network}-{sidecar.name}",
            command=None if sidecar.command is None else list(sidecar.command),
            entrypoint=None if sidecar.entrypoint is None else list(sidecar.entrypoint),
            environment=dict(sidecar.env),
            working_dir=sidecar.workdir,
            user=sidecar.user,
            labels={**self._labels, SERVICE_LABEL: sidecar.name},
            network=self.network,
            networking_config={
                self.network: self._client.api.create_endpoint_config(aliases=[sidecar.name, *sidecar.aliases])
            },
            cap_drop=["ALL"],
            cap_add=sorted({*CAPABILITIES, *sidecar.cap_add}),
            security_opt=["no-new-privileges"],
            pids_limit=sidecar.pids_limit or DEFAULT_SIDECAR_PIDS,
            mem_limit=f"{memory_mb}m",
            memswap_limit=f"{memory_mb}m",
            nano_cpus=int((sidecar.cpus or DEFAULT_CPUS) * 1e9),
            tmpfs={path: options for path, options in sidecar.tmpfs},
            extra_hosts=dict(sidecar.extra_hosts),
            init=sidecar.init or None,
            log_config=LogConfig(type="json-file", config=LOG_LIMIT),
        )
        if sidecar.shm_size_mb is not None:
            options["shm_size"] = f"{sidecar.shm_size_mb}m"
        if sidecar.healthcheck is not None:
            check = sidecar.healthcheck
            options["healthcheck"] = {
                **({"test": list(check.test)} if check.test else {}),
                "interval": int(check.interval_s * _NS_PER_S), "timeout": int(check.timeout_s * _NS_PER_S),
                "retries": check.retries, "start_period": int(check.start_period_s * _NS_PER_S),
            }  # fmt: skip
        return options

    async def _wait(self, dependencies: tuple[Dependency, ...], waiter: str) -> None:
        deadline = time.monotonic() + SERVICES_READY_S
        pending = list(dependencies)
        while pending:
            for dependency in list(pending):
                container_id = self._containers.get(dependency.service)
                if container_id is None:
                    raise SandboxError("the sandbox was closed while its services were starting")
                state = await asyncio.to_thread(self._state, container_id)
                verdict, why = readiness(dependency.condition, state)
                if verdict is Readiness.READY:
                    pending.remove(dependency)
                elif verdict is Readiness.FAILED:
                    raise SandboxError(self._failure(dependency, waiter, why, container_id))
            if pending and time.monotonic() > deadline:
                late = pending[0]
                why = f"did not reach {late.condition.value} within {SERVICES_READY_S:g} s"
                raise SandboxError(self._failure(late, waiter, why, self._containers.get(late.service, "")))
            if pending:
                await asyncio.sleep(_POLL_S)

    def _failure(self, dependency: Dependency, waiter: str, why: str, container_id: str) -> str:
        return (
            f"service {dependency.service!r} {why}; {waiter} waits for it ({dependency.condition.value}), so the "
            f"episode cannot start{self._output(container_id)}"
        )

    def _state(self, container_id: str) -> dict[str, Any]:
        try:
            return self._client.api.inspect_container(container_id).get("State") or {}
        except NotFound:
            return {"Status": "dead", "ExitCode": None}

    def _output(self, container_id: str) -> str:
        try:
            logs = self._client.api.logs(container_id, tail=_LOG_TAIL).decode("utf-8", "replace").strip()
        except DockerException:
            return ""
        return f". Its output:\n{logs}" if logs else ". It wrote nothing."


def _network_problem(exc: APIError) -> str:
    detail = str(exc.explanation or exc)
    if "address pool" in detail or "non-overlapping" in detail:
        return (
            f"Docker has no address range left for another episode network ({detail}): run fewer multi-container "
            "episodes at once, or give dockerd more with `default-address-pools` in /etc/docker/daemon.json"
        )
    return f"cannot create the episode's network: {detail}"
