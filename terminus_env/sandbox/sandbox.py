"""One hardened container per episode, driven through a single control channel.

Created through the docker-py API with a cut-down capability set, no network unless the spec allows it (or has
sidecars: then the episode's own network, see services.py), pids/memory/CPU limits, ``init``, no-new-privileges,
owner labels, a capped log and a lifetime backstop. The
container's main process (inside/main.py) splits it into the agent's side and the host's side before the
image's ENTRYPOINT runs, on the agent's side, with the keep-alive command. Removed on close, at exit, on SIGTERM,
when the owner dies (the daemon sees its channel close) and, failing all that, by the reaper.

Disk: the process's watch of the engine (disk.py) measures every sandbox's writable layer each ``DISK_POLL_S``,
all at once, and the sandbox stops the agent's processes once its layer broke the task's ``storage_mb``. Where the
storage driver enforces a size (overlay2 on xfs with pquota, and others) the layer also gets a hard limit just above
``storage_mb`` (disk.py says why). Each file the agent writes is capped at the limit too (RLIMIT_FSIZE).
Writes to tmpfs mounts count against the container's memory, not the disk.
"""

from __future__ import annotations

import asyncio
import base64
import enum
import functools
import math
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
from docker.errors import APIError, DockerException, ImageNotFound
from docker.types import LogConfig

from terminus_env.rules import lost_by_agent
from terminus_env.sandbox.archives import tar_dir, tar_file
from terminus_env.sandbox.channel import LOG_PREFIX, Channel, ChannelFolder, Route, channel_route
from terminus_env.sandbox.cleanup import REGISTRY, remove_container
from terminus_env.sandbox.disk import (
    HARD_LIMIT_HEADROOM_MB,
    Layer,
    Unmeasured,
    Use,
    disk_watch,
    over_limit,
    readable_layer,
)
from terminus_env.sandbox.docker_client import connect
from terminus_env.sandbox.errors import DiskLimitExceeded, SandboxError, SandboxLost
from terminus_env.sandbox.layer_diff import LayerDiff, LayerFolders, layer_diff
from terminus_env.sandbox.owner import Owner, new_run_id
from terminus_env.sandbox.package_proof import lift_packaged
from terminus_env.sandbox.reaper import reap
from terminus_env.sandbox.services import EpisodeServices
from terminus_env.sandbox.shipping import MAIN_COMMAND, main_environment
from terminus_env.sandbox.spec import DAEMON_CAPABILITIES, LOG_LIMIT, SandboxSpec
from terminus_env.sandbox.tamper import Finding, WatchReport, is_bytecode, judge, queries
from terminus_env.sandbox.terminal import Terminal, TerminalOutput
from terminus_env.utils.output_cap import join_capped

__all__ = ["ExecResult", "Sandbox", "Terminal", "TerminalOutput", "VerifierRun"]

EXEC_OUTPUT_LIMIT = 1_000_000
HANDOVER_S = 60.0
"""How long an image's ENTRYPOINT may take to hand over to the keep-alive command before the start fails."""
_GRACE_S = 30.0  # how much longer than a command's own timeout the host waits for the daemon
_MB = 1024 * 1024
_storage_limits: dict[str, bool] = {}  # per engine (its ID): can it enforce a writable layer's size?
_engine_infos: weakref.WeakKeyDictionary[docker.DockerClient, dict[str, Any]] = weakref.WeakKeyDictionary()


@dataclass
class ExecResult:
    exit_code: int  # 124 when the timeout killed the command
    output: str  # stdout and stderr together, capped at EXEC_OUTPUT_LIMIT bytes
    timed_out: bool
    duration_s: float


@dataclass
class VerifierRun:
    """A verifier's run on its own side, and the files it left there (None: not written)."""

    result: ExecResult
    files: dict[str, bytes | None] = field(default_factory=dict)
    limits_hit: tuple[str, ...] = ()
    """The container's limits ("pids", "memory") hit while the verifier ran: its result proves nothing then."""
    tampering: tuple[Finding, ...] = ()
    """What the verifier ran that the agent changed in its runtime (see ``tamper.py``): its result proves nothing."""
    refused: dict[str, str] = field(default_factory=dict)
    """Files the verifier left that are not plain files (a folder, a FIFO, a link), with why; they read as None."""
    stages: dict[str, float] = field(default_factory=dict)
    """Seconds each stage of the run took, on the host's side and the daemon's, in order: where grading's time goes."""


class Sandbox:
    """One container with a tmux terminal; create with ``await Sandbox.start(spec)``."""

    def __init__(
        self, spec: SandboxSpec, client: docker.DockerClient, container_id: str, channel: Channel,
        terminal: Terminal, user: str | None, layer: Layer, services: EpisodeServices | None = None,
        workdir: str | None = None, *, born: float,
    ) -> None:  # fmt: skip
        self.spec = spec
        self._ends = born + spec.lifetime_s  # ``born``: before the container started, so this is before its own end
        self.id = container_id
        self.workdir = workdir or spec.workdir
        """Where the terminal, commands and the verifier start: the task's workdir, else the image's WORKDIR."""
        self.terminal = terminal
        self._client = client
        self._services = services
        self._channel = channel
        self._user = user
        self._closed = False
        self._violation: DiskLimitExceeded | None = None
        self._stopping: asyncio.Task[None] | None = None
        self._loop = asyncio.get_running_loop()
        self._layer = layer
        self._disk = disk_watch(client, layer.engine)
        self._disk.add(layer, self._on_disk_over)
        channel.unanswered_is_agents = functools.partial(_runs_unheld, client, container_id)  # the agent exists now

    @classmethod
    async def start(cls, spec: SandboxSpec, *, client: docker.DockerClient | None = None) -> Sandbox:
        REGISTRY.hook()
        client = await asyncio.to_thread(connect, client)
        if REGISTRY.claim_reap():
            await asyncio.to_thread(reap, False, client)
        run = new_run_id()
        services = None if spec.services is None else EpisodeServices(client, spec, run)
        try:
            if services is not None:
                await services.start()
            return await cls._start_container(spec, client, run, services)
        except BaseException:
            if services is not None:  # after the container: the network goes once nothing is on it
                await asyncio.to_thread(services.remove)
            raise

    @classmethod
    async def _start_container(
        cls, spec: SandboxSpec, client: docker.DockerClient, run: str, services: EpisodeServices | None
    ) -> Sandbox:
        born = time.monotonic()  # before the container's main process starts its lifetime's clock
        creating = asyncio.ensure_future(asyncio.to_thread(_create, client, spec, run, services))
        try:
            container_id, image, layer, folder = await asyncio.shield(creating)
        except asyncio.CancelledError:  # the thread still finishes; remove what it makes
            def abandon(done: asyncio.Future[tuple[str, Any, Any, ChannelFolder | None]]) -> None:
                if not done.cancelled() and done.exception() is None:
                    _abandon(client, done)

            creating.add_done_callback(abandon)
            raise
        channel = None
        try:
            user = spec.user or image.user or None
            workdir = spec.workdir or image.workdir or None
            channel, handover = await Channel.open(client, container_id, HANDOVER_S, folder)
            if handover != "ready":  # read the log while the channel holds the container: hung up, it is removed
                raise SandboxError(await asyncio.to_thread(_handover_failure, client, container_id, spec, handover))
            terminal = await Terminal.start(channel, user=user, workdir=workdir)
            if layer.upper_dir is None:  # only Docker can measure it: can it here?
                await asyncio.to_thread(disk_watch(client, layer.engine).check_engine, layer)
        except BaseException:
            await asyncio.to_thread(_discard, client, container_id)
            if channel is not None:  # its reading task and its folder go too (Channel.open cleans up after itself)
                await channel.close()
            raise
        return cls(spec, client, container_id, channel, terminal, user, layer, services, workdir, born=born)

    async def exec(
        self, cmd: str, timeout: float, *, user: str | None = None, env: Mapping[str, str] | None = None,
        workdir: str | None = None,
    ) -> ExecResult:  # fmt: skip
        """Run ``bash -c cmd`` on the agent's side, outside the terminal, as the agent could have run it.

        On timeout everything it started is killed; what it leaves running in the background stays, like the
        agent's own processes.
        """
        reply = await self._channel.request(
            "exec", timeout + _GRACE_S, side="agent", cmd=cmd, timeout=timeout, user=user or self._user,
            env=dict(env or {}), workdir=workdir or self.workdir, max_output=EXEC_OUTPUT_LIMIT,
        )  # fmt: skip
        return _exec_result(reply)

    async def verify(
        self, tests: bytes, cmd: str, timeout: float, *, user: str, env: Mapping[str, str] | None = None,
        read: Sequence[str] = (), max_bytes: int = 4_000_000, harbor_verdict: bool = False,
    ) -> VerifierRun:  # fmt: skip
        """Run a verifier on its own side: fresh /tests (unpacked from the tar ``tests``) and /logs/verifier,
        ``bash -c cmd`` as ``user``, then the files ``read``, and what it ran that the agent changed.
        ``harbor_verdict`` (evaluation): the run stands as Harbor's would, and the findings say what training would
        refuse: a process that ran the agent's code may open the reward files, and the agent's pytest plugin
        registrations are not hidden. False (training): that process is refused, and those registrations hidden.

        Those two folders are private to the verifier's side, and nothing on the agent's side can see the verifier's
        processes, so nothing the agent left running can change the tests or what the verifier writes; what the
        agent did to the verifier's runtime (its interpreters, libraries, test runner) is in ``tampering``.
        """
        started = time.monotonic()
        diff = await asyncio.to_thread(layer_diff, self._client, self.id, self._layer.folders)
        diffed = time.monotonic()
        reply = await self._channel.request(
            "verify", timeout + _GRACE_S, tests=base64.b64encode(tests).decode(), cmd=cmd, timeout=timeout,
            user=user, env=dict(env or {}), workdir=self.workdir, read=list(read), max_bytes=max_bytes,
            harbor_verdict=harbor_verdict, links=list(diff.links),
            bytecode=[path for path in diff.paths if is_bytecode(path)],
            plugins=[path for path in diff.paths if path.endswith("/entry_points.txt")], changed=diff.touched(),
        )  # fmt: skip
        replied = time.monotonic()
        files = {path: None if data is None else base64.b64decode(data) for path, data in reply["files"].items()}
        tampering = await self._judge_watch(WatchReport.from_reply(reply), diff)
        inside = {f"daemon:{name}": float(spent) for name, spent in (reply.get("stages") or {}).items()}
        stages = {"host:diff": diffed - started, **inside,
                  "host:channel": replied - diffed - sum(inside.values()), "host:judge": time.monotonic() - replied}
        return VerifierRun(
            _exec_result(reply), files, tuple(reply.get("limits_hit", ())), tampering, dict(reply.get("refused", {})),
            stages,
        )

    async def _judge_watch(self, report: WatchReport, diff: LayerDiff) -> tuple[Finding, ...]:
        """The rules of tamper.py over the watch's report, with the layer's changes from before the run and the
        lookups the rules ask for, less what a package's provenance disproves (package_proof.py)."""
        asked = queries(report, self.workdir)
        found: dict[str, Any] = {}
        if asked.patterns:
            found = (await self._channel.request("lookup", _GRACE_S, patterns=list(asked.patterns)))["found"]
        changes = await asyncio.to_thread(diff.kinds_of, asked.diff_paths)
        findings = judge(report, self.workdir, changes, found, report.links)
        return await lift_packaged(findings, report, self._channel.request, self._client, self.id)

    async def put_dir(self, local: Path, dest: str) -> None:
        """Copy the contents of folder ``local`` into ``dest`` (created if missing), where both sides see it."""
        local = Path(local)
        if not local.is_dir():
            raise SandboxError(f"put_dir: {local} is not a folder; pass the folder whose contents to copy")
        await self.put_archive(tar_dir(local, dest))

    async def put_file(self, data: bytes, dest: str, mode: int = 0o644) -> None:
        """Write ``data`` to the file ``dest`` (parent folders are created), where both sides see it."""
        await self.put_archive(tar_file(data, dest, mode))

    async def put_archive(self, data: bytes) -> None:
        """Unpack the tar ``data`` at the container's root, where both sides see it (a remote caller's put_dir)."""
        await asyncio.to_thread(self._put_archive, data)

    async def read_file(self, path: str, max_bytes: int = 1_000_000) -> bytes | None:
        """The file's first ``max_bytes`` bytes as the host's side sees it, or None if it does not exist."""
        reply = await self._channel.request("read", _GRACE_S, path=path, max_bytes=max_bytes)
        return None if reply["data"] is None else base64.b64decode(reply["data"])

    async def stop_agent(self) -> None:
        """Kill every process on the agent's side; the terminal is gone afterwards, the container stays."""
        await self._channel.request("stop_agent", _GRACE_S)

    @property
    def violation(self) -> DiskLimitExceeded | None:
        """The limit the agent broke, once the disk watch has seen it (its processes are being stopped by then)."""
        return self._violation

    async def check_disk(self) -> DiskLimitExceeded | None:
        """Measure the writable layer now (before grading: the watch only looks every DISK_POLL_S)."""
        if self._violation is None and not self._closed:
            try:
                used = await asyncio.to_thread(self._disk.measure, self._layer)
            except (DockerException, OSError) as exc:
                raise SandboxError(f"cannot measure sandbox {self.id[:12]}'s disk use: {exc}") from exc
            if used is None:
                raise SandboxLost(f"container {self.id[:12]} is gone")
            if over_limit(used, self._layer.limit_mb):
                self._disk_over(used)
        if self._stopping is not None:
            await asyncio.gather(self._stopping, return_exceptions=True)
        return self._violation

    async def close(self) -> None:
        """Remove the container; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._disk.remove(self.id)
        if self._stopping is not None:
            self._stopping.cancel()
            await asyncio.gather(self._stopping, return_exceptions=True)
        try:
            await asyncio.to_thread(_discard, self._client, self.id)
        finally:
            if self._services is not None:  # after the container: the network goes once nothing is on it
                await asyncio.to_thread(self._services.remove)
        await self._channel.close()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def alive(self) -> bool:
        """Not closed, and its control channel (hence its container) is still up."""
        return not self._closed and not self._channel.closed

    @property
    def life_left_s(self) -> float:
        """How long the container has before its lifetime ends it (never more than it really has)."""
        return max(self._ends - time.monotonic(), 0.0)

    async def lost_to_agent(self) -> bool:
        """Whether the agent's doing ended this sandbox's control daemon (the rule: ``rules.lost_by_agent``)."""
        try:
            attrs = await asyncio.to_thread(self._client.api.inspect_container, self.id)
        except DockerException:
            return False  # removed, or Docker failed: nothing inside a container can remove it
        state = attrs.get("State") or {}
        running = bool(state.get("Running")) and not state.get("Paused")
        return lost_by_agent(running, bool(state.get("OOMKilled")))

    @property
    def daemon_stderr(self) -> str:
        """What the control daemon wrote to its stderr: a Python traceback there is a bug of ours."""
        return self._channel.stderr

    async def __aenter__(self) -> Sandbox:  # noqa: PYI034 - Python 3.10 has no typing.Self
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _on_disk_over(self, used: Use) -> None:
        """The disk watch's report, from its thread: handled on this sandbox's loop."""
        try:
            self._loop.call_soon_threadsafe(self._disk_over, used)
        except RuntimeError:
            pass  # the loop is closed: so is this sandbox, and its container goes with its channel

    def _disk_over(self, used: Use) -> None:
        if self._violation is not None or self._closed:
            return
        if isinstance(used, Unmeasured):
            self._violation = DiskLimitExceeded(None, self._layer.limit_mb, used.why)
        else:
            self._violation = DiskLimitExceeded(used / _MB, self._layer.limit_mb)
        self._disk.remove(self.id)
        self._stopping = self._loop.create_task(self._stop_after_violation())

    async def _stop_after_violation(self) -> None:
        try:
            await self.stop_agent()
        except SandboxError:
            pass  # the container went away meanwhile: nothing is left to stop

    def _put_archive(self, data: bytes) -> None:
        try:
            self._client.api.put_archive(self.id, "/", data)
        except APIError as exc:
            raise SandboxError(f"copying into sandbox {self.id[:12]} failed: {exc}") from exc


def _exec_result(reply: Mapping[str, Any]) -> ExecResult:
    output = join_capped(reply["head"], reply["tail"], reply["omitted"], EXEC_OUTPUT_LIMIT)
    return ExecResult(reply["exit_code"], output, reply["timed_out"], reply["duration_s"])


@dataclass(frozen=True)
class _ImageDefaults:
    """What the image says about how its programs run, where the task does not say otherwise."""

    user: str = ""
    workdir: str = ""


def _abandon(client: docker.DockerClient, created: asyncio.Future[tuple[str, Any, Any, ChannelFolder | None]]) -> None:
    container_id, _, _, folder = created.result()
    _discard(client, container_id)
    if folder is not None:
        folder.remove()


def _create(
    client: docker.DockerClient, spec: SandboxSpec, run: str, services: EpisodeServices | None
) -> tuple[str, _ImageDefaults, Layer, ChannelFolder | None]:
    """Create and start the container (on the services' network, if any); returns its id, the image's default
    user and working folder, its writable layer as the disk watch measures it, and the folder its DIRECT channel
    comes through (None: through the relay)."""
    info = _engine_info(client)
    folder = ChannelFolder.make() if channel_route(client, info) is Route.DIRECT else None
    try:
        return _create_in(client, spec, run, services, info, folder)
    except BaseException:
        if folder is not None:
            folder.remove()
        raise


def _create_in(
    client: docker.DockerClient, spec: SandboxSpec, run: str, services: EpisodeServices | None,
    info: dict[str, Any], folder: ChannelFolder | None,
) -> tuple[str, _ImageDefaults, Layer, ChannelFolder | None]:  # fmt: skip
    try:
        config = client.api.inspect_image(spec.image).get("Config") or {}
    except ImageNotFound as exc:
        raise SandboxError(
            f"image {spec.image!r} does not exist here; build it (ensure_image, or `terminus-env images base`)"
        ) from exc
    except APIError as exc:
        raise SandboxError(f"cannot inspect image {spec.image!r}: {exc.explanation or exc}") from exc
    engine = info.get("ID") or client.api.base_url  # base_url alone is the same for every engine on a unix socket
    lifetime = str(math.ceil(spec.lifetime_s))
    network, network_options = _network(spec, services)
    file_limit = str(spec.effective_storage_mb * _MB)
    options: dict[str, Any] = dict(
        entrypoint=[
            *MAIN_COMMAND, lifetime, str(HANDOVER_S), file_limit, config.get("User") or "",
            network.value, Route.RELAY.value if folder is None else Route.DIRECT.value, "--",
            *(config.get("Entrypoint") or []),
        ],
        command=["sleep", lifetime],  # the keep-alive, handed to the image's ENTRYPOINT as Harbor does
        user="0",  # the main process splits the container; the ENTRYPOINT still runs as the image's USER
        auto_remove=True,
        init=True,
        labels=Owner.current().labels(run),
        cap_drop=["ALL"],
        cap_add=[*spec.capabilities, *DAEMON_CAPABILITIES],
        security_opt=_security_options(info),
        pids_limit=spec.pids_limit,
        mem_limit=f"{spec.effective_memory_mb}m",
        memswap_limit=f"{spec.effective_memory_mb}m",
        nano_cpus=int(spec.effective_cpus * 1e9),
        environment={**spec.env, **main_environment()},
        working_dir=spec.workdir,
        log_config=LogConfig(type="json-file", config=LOG_LIMIT),
        tmpfs={path: options for path, options in spec.tmpfs},
        extra_hosts=dict(spec.extra_hosts),
        mounts=[] if folder is None else [folder.mount()],
        **({} if spec.shm_size_mb is None else {"shm_size": f"{spec.shm_size_mb}m"}),
    )
    options.update(network_options)
    enforced = _storage_limits.get(engine, True)
    container = None
    if enforced:
        try:
            size = f"{spec.effective_storage_mb + HARD_LIMIT_HEADROOM_MB}M"
            container = _create_container(client, spec, options, {"size": size})
        except SandboxError as exc:
            if "storage" not in str(exc).lower():
                raise
            _storage_limits[engine] = enforced = False
    if container is None:
        container = _create_container(client, spec, options, None)
    REGISTRY.add(container.id, client)
    try:
        container.start()
    except APIError as exc:
        _discard(client, container.id)
        raise SandboxError(f"cannot start a container from {spec.image!r}: {exc.explanation or exc}") from exc
    graph_driver = container.attrs.get("GraphDriver") or {}
    upper_dir = (graph_driver.get("Data") or {}).get("UpperDir")
    layer = Layer(container.id, engine, spec.effective_storage_mb, enforced, readable_layer(upper_dir),
                  LayerFolders.of(graph_driver))  # fmt: skip
    return container.id, _ImageDefaults(config.get("User") or "", config.get("WorkingDir") or ""), layer, folder


class Network(enum.Enum):
    """What the main process does about the network first (its NETWORK argument; inside/names.py has the same words)."""

    HOSTS = "hosts"  # write the /etc/hosts Docker writes for a container without a network
    CUT_OFF = "cut-off"  # cut the container off the host, keeping its sidecars
    AS_IS = "as-is"  # nothing


def _network(spec: SandboxSpec, services: EpisodeServices | None) -> tuple[Network, dict[str, Any]]:
    """The container's network options, and what the main process does about them first (its NETWORK argument).
    Without internet or sidecars the network is disabled rather than ``none``: the same loopback-only namespace
    without Docker's network set-up, which was ~200 ms of a start here (the main process writes the /etc/hosts
    that set-up would have); ``extra_hosts`` need that set-up, so they keep ``none``."""
    if services is not None:
        return (Network.AS_IS if spec.allow_internet else Network.CUT_OFF), services.main_options()
    if spec.allow_internet:
        return Network.AS_IS, {}
    if spec.extra_hosts:
        return Network.AS_IS, {"network_mode": "none"}
    return Network.HOSTS, {"network_disabled": True}


def _create_container(
    client: docker.DockerClient, spec: SandboxSpec, options: dict[str, Any], storage: dict[str, str] | None
) -> Any:
    try:  # create, not run: run would try to pull a missing image
        return client.containers.create(spec.image, **options, **({"storage_opt": storage} if storage else {}))
    except APIError as exc:
        raise SandboxError(f"cannot create a container from {spec.image!r}: {exc.explanation or exc}") from exc


def _engine_info(client: docker.DockerClient) -> dict[str, Any]:
    """What the engine says about itself (``docker info``), asked once per client: the call costs ~17 ms of a start
    here, more with many containers, and what a start reads of it (the engine's ID, its security options) does not
    change. Empty when the engine does not say (asked again next time)."""
    info = _engine_infos.get(client)
    if info is None:
        try:
            info = client.info()
        except DockerException:
            return {}
        _engine_infos[client] = info
    return info


def _security_options(info: dict[str, Any]) -> list[str]:
    """no-new-privileges; and where the engine confines containers with AppArmor, no AppArmor profile: Docker's
    default profile forbids the mounts that split the container, and the agent's side gets no CAP_SYS_ADMIN and
    Docker's seccomp rules for a container without it, whatever the profile."""
    options = ["no-new-privileges"]
    security = info.get("SecurityOptions") or []
    if any("apparmor" in str(option) for option in security):
        options.append("apparmor=unconfined")
    return options


def _handover_failure(client: docker.DockerClient, container_id: str, spec: SandboxSpec, verdict: str) -> str:
    lines = _log_through(client, container_id, f"{LOG_PREFIX}handover ")
    logs = "\n".join(line for line in lines if not line.startswith(LOG_PREFIX)).strip()  # the ENTRYPOINT's own
    what = {
        "no-handover": f"did not start the keep-alive command within {HANDOVER_S:g} s",
    }.get(verdict, f"ended before starting the keep-alive command ({verdict.replace('exited', 'exit code')})")
    return (
        f"the ENTRYPOINT of image {spec.image!r} {what}; it must end by running its arguments (e.g. `exec \"$@\"`). "
        + (f"Its output:\n{logs}" if logs else "It wrote nothing.")
    )


def _runs_unheld(client: docker.DockerClient, container_id: str) -> bool:
    """Whether the container runs, unpaused, and the engine answers: then nothing outside it held its daemon."""
    try:
        state = client.api.inspect_container(container_id).get("State") or {}
    except DockerException:
        return False
    return bool(state.get("Running")) and not state.get("Paused")


def _log_through(client: docker.DockerClient, container_id: str, marker: str, wait_s: float = 10.0) -> list[str]:
    """The container log's last lines once a line starting with ``marker`` is in it: the engine copies a
    container's output into its log on its own time, so what was written before the marker may not be there yet."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            lines = client.api.logs(container_id, tail=40).decode("utf-8", "replace").splitlines()
        except DockerException:
            return []
        if any(line.startswith(marker) for line in lines) or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def _discard(client: docker.DockerClient, container_id: str) -> None:
    remove_container(client, container_id)
    REGISTRY.discard(container_id)
