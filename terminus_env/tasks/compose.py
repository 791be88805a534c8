"""Read a task's compose file: the main (agent's) container's settings, and the sidecars that run beside it.

Harbor puts ``environment/docker-compose.yaml`` beside the Dockerfile; its service ``main`` is the agent's container
and every other service is a sidecar. Terminal-Bench 1 puts ``docker-compose.yaml`` at the top of the task; its
``client`` service is the agent's. Which file each harness reads, and with which variables, is
``terminus_env.tasks.task_compose``; this module reads one file. terminus-env starts these itself through the Docker API (see
``terminus_env.sandbox.services``), so only the settings below are read:

- honoured: ``build``, ``image``, ``command``, ``entrypoint``, ``environment``, ``env_file``, ``working_dir``,
  ``user``, ``shm_size``, ``tmpfs``, ``extra_hosts``, ``mem_limit``, ``cpus``, ``pids_limit``,
  ``deploy.resources.limits``, ``depends_on`` (with its conditions), ``healthcheck``, ``cap_add`` (within Docker's
  default set), ``init``, ``hostname`` and ``container_name`` (as names on the episode's network);
- ignored, because they change nothing here: ports, restart policies, labels, logging, networks (every service
  shares the episode's one network), and the harness's own settings on the main service (its image name, its
  keep-alive command, the log folders it mounts); a main ``command`` that is no keep-alive is refused;
- anything else refuses the task, naming the setting, rather than running it differently from its author's intent.

Variables (``${VAR}``) are resolved as Docker Compose does: from the harness's own variables (Terminal-Bench's
``T_BENCH_*``, Harbor's ``CONTEXT_DIR``, ...), then the host's environment; an unset one is empty.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from terminus_env.utils.limits import MAX_CPUS, MAX_MEMORY_MB, MAX_PIDS, MAX_TIMEOUT_S, MIN_CPUS, MIN_MEMORY_MB, MIN_PIDS
from terminus_env.utils.sidecars import Build, Condition, Dependency, Healthcheck, Services, Sidecar
from terminus_env.tasks.task import TaskError
from terminus_env.tasks.templates import TemplateError, substitute

HARBOR_MAIN = "main"
"""Harbor's name for the agent's service, which its compose file may leave out (the Dockerfile is its build)."""
DOCKER_DEFAULT_CAPABILITIES = frozenset(
    "CHOWN DAC_OVERRIDE FSETID FOWNER MKNOD NET_RAW SETGID SETUID SETFCAP SETPCAP NET_BIND_SERVICE SYS_CHROOT KILL "
    "AUDIT_WRITE".split()
)
"""What Docker gives a container by default: a sidecar may add these back, nothing more."""
_IGNORED = frozenset({  # change nothing about how an episode runs here
    "ports", "expose", "restart", "labels", "logging", "networks", "stop_grace_period", "stop_signal", "platform",
    "stdin_open", "tty", "pull_policy", "cap_drop", "mem_reservation", "memswap_limit", "cpu_shares",
})  # fmt: skip
_COMMON = frozenset({
    "build", "image", "command", "environment", "env_file", "working_dir", "shm_size", "tmpfs", "extra_hosts",
    "mem_limit", "cpus", "pids_limit", "deploy", "depends_on", "hostname", "container_name", "volumes", "network_mode",
    "init",
})  # fmt: skip
_MAIN_KEYS = _IGNORED | _COMMON | {"healthcheck"}  # the main container's keep-alive has nothing to check
_SIDECAR_KEYS = _IGNORED | _COMMON | {"entrypoint", "user", "healthcheck", "cap_add"}
_TOP_KEYS = frozenset({"services", "version", "name", "networks", "volumes"})
_HARNESS_MOUNT = re.compile(r"\$\{?(T_BENCH_|HOST_|ENV_)")  # the harness's log folders, mounted by the harness
_KEEP_ALIVE = re.compile(r"\bsleep\s+(?:infinity|inf)\b|\btail\s+-f\s+/dev/null\b")
"""The agent's service's command in every real compose file: a keep-alive, which the harness's own replaces."""
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([bkmg]?)b?\s*$", re.IGNORECASE)
_BYTES_PER_UNIT = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_SECONDS_PER_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True)
class ComposeEnvironment:
    """What a compose file says about an episode. None and empty mean the file leaves it to the task's defaults."""

    services: Services | None = None
    """None when the file defines no sidecar."""
    env: tuple[tuple[str, str], ...] = ()
    workdir: str | None = None
    cpus: float | None = None
    memory_mb: int | None = None
    pids_limit: int | None = None
    shm_size_mb: int | None = None
    tmpfs: tuple[tuple[str, str], ...] = ()
    extra_hosts: tuple[tuple[str, str], ...] = ()
    no_network: bool = False
    """The main service has ``network_mode: none``."""
    main_context: Path | None = None
    """The folder whose Dockerfile the agent's image builds from, where the file says (Terminal-Bench 1's client
    may be built from a folder of its own, as in ``simple-web-scraper``)."""


def read_compose(
    file: Path, *, main: str, main_build: Path | None, variables: Mapping[str, str], image_prefix: str,
    build_timeout_s: float,
) -> ComposeEnvironment:  # fmt: skip
    """Read ``file``; ``main`` names the agent's service (Terminal-Bench 1: its ``client`` or the only service). The
    agent's image is built from ``main_build``'s Dockerfile (Harbor's ``environment/``), or, with None, from the
    folder the service's own ``build`` names (Terminal-Bench 1). Sidecar images are named after ``image_prefix``."""
    try:
        raw = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise TaskError(f"{file}: not a readable compose file: {exc}") from exc
    reader = _Reader(file, variables)
    if not isinstance(raw, Mapping) or not isinstance(raw.get("services"), Mapping) or not raw["services"]:
        raise TaskError(f"{file}: a compose file needs a 'services' table with at least one service")
    for key in raw:
        if key not in _TOP_KEYS and not str(key).startswith("x-"):
            raise reader.refuse(f"top-level '{key}'")
    services = {str(name): _table(reader, body, f"service '{name}'") for name, body in raw["services"].items()}
    main = _main_name(reader, services, main)
    main_body = services.get(main, {})
    environment = _main(reader, main, main_body, main_build)
    known = set(services) | {main}
    sidecars = [
        _sidecar(reader, name, body, known, image_prefix, build_timeout_s)
        for name, body in services.items()
        if name != main
    ]
    main_depends = _depends_on(reader, main, main_body.get("depends_on"), known)
    if not sidecars:
        return environment
    _check_graph(reader, main, sidecars)
    if environment.no_network:
        raise TaskError(f"{file}: service '{main}' has network_mode none, yet it has services to reach")
    aliases = _aliases(reader, main, main_body)
    return dataclasses.replace(environment, services=Services(tuple(sidecars), main, aliases, main_depends))


def _main_name(reader: _Reader, services: dict[str, dict[str, Any]], main: str) -> str:
    if main in services or main == HARBOR_MAIN:  # Harbor's main may be left out: it is the Dockerfile's
        return main
    for name, body in services.items():
        if "T_BENCH_TASK_DOCKER_CLIENT_CONTAINER_NAME" in str(body.get("container_name", "")):
            return name
    if len(services) == 1:
        return next(iter(services))
    raise TaskError(
        f"{reader.file}: no service '{main}' (the agent's container) among {', '.join(services)}; name the agent's "
        f"service '{main}'"
    )


def _main(reader: _Reader, name: str, body: Mapping[str, Any], main_build: Path | None) -> ComposeEnvironment:
    reader.check_keys(name, body, _MAIN_KEYS)
    build = _build(reader, name, body["build"]) if "build" in body else None
    if build is not None and main_build is not None and build.context != main_build.resolve():
        raise TaskError(
            f"{reader.file}: service '{name}' builds from {build.context / build.dockerfile}; the agent's "
            f"container is built from {main_build / 'Dockerfile'}, so point its build there"
        )
    if build is not None and build.dockerfile != "Dockerfile":
        raise reader.refuse(
            f"'build.dockerfile' {build.dockerfile!r} of the agent's service '{name}' (its image is built from the "
            "context's Dockerfile: rename the file to Dockerfile)"
        )
    if build is not None and build.args:
        raise reader.refuse(
            f"'build.args' of the agent's service '{name}' (write the values into its Dockerfile as ARG defaults)"
        )
    command = _argv(reader, body.get("command"), f"{name}.command")
    if command is not None and not _KEEP_ALIVE.search(" ".join(command)):
        raise reader.refuse(
            f"command {shlex.join(command)!r} of the agent's service '{name}' (its container runs the harness's "
            "keep-alive; start the program from the image's ENTRYPOINT, which runs, ending with `exec \"$@\"`)"
        )
    _harness_mounts_only(reader, name, body.get("volumes"))
    network_mode = reader.text(body.get("network_mode", "bridge"), f"{name}.network_mode")
    if network_mode not in ("none", "bridge", "default"):
        raise reader.refuse(f"network_mode '{network_mode}' of service '{name}'")
    limits = _limits(reader, name, body)
    return ComposeEnvironment(
        services=None,
        env=_environment(reader, name, body),
        workdir=reader.optional_text(body.get("working_dir"), f"{name}.working_dir"),
        cpus=limits["cpus"],
        memory_mb=limits["memory_mb"],
        pids_limit=limits["pids_limit"],
        shm_size_mb=_megabytes(reader, body.get("shm_size"), f"{name}.shm_size", 1, MAX_MEMORY_MB),
        tmpfs=_tmpfs(reader, name, body.get("tmpfs")),
        extra_hosts=_extra_hosts(reader, name, body.get("extra_hosts")),
        no_network=network_mode == "none",
        main_context=None if build is None else build.context,
    )


def _sidecar(
    reader: _Reader, name: str, body: Mapping[str, Any], known: set[str], image_prefix: str, timeout_s: float
) -> Sidecar:
    reader.check_keys(name, body, _SIDECAR_KEYS)
    if not re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*", name):
        raise TaskError(f"{reader.file}: service name {name!r} is not a valid host name; use letters, digits, - _ .")
    build = None
    if "build" in body:
        build = dataclasses.replace(_build(reader, name, body["build"]), name=f"{image_prefix}-{name}",
                                    timeout_s=timeout_s)  # fmt: skip
        if not (build.context / build.dockerfile).is_file():
            raise TaskError(f"{reader.file}: service '{name}' builds from {build.context / build.dockerfile}, "
                            "which does not exist")  # fmt: skip
    image = None if build else reader.optional_text(body.get("image"), f"{name}.image")
    if build is None and not image:
        raise TaskError(f"{reader.file}: service '{name}' has neither 'build' nor 'image'; give it one")
    _harness_mounts_only(reader, name, body.get("volumes"))
    network_mode = reader.text(body.get("network_mode", "bridge"), f"{name}.network_mode")
    if network_mode not in ("bridge", "default"):
        raise reader.refuse(f"network_mode '{network_mode}' of service '{name}'")
    limits = _limits(reader, name, body)
    return Sidecar(
        name=name,
        image=image,
        build=build,
        command=_argv(reader, body.get("command"), f"{name}.command"),
        entrypoint=_argv(reader, body.get("entrypoint"), f"{name}.entrypoint"),
        env=_environment(reader, name, body),
        workdir=reader.optional_text(body.get("working_dir"), f"{name}.working_dir"),
        user=reader.optional_text(body.get("user"), f"{name}.user"),
        aliases=_aliases(reader, name, body),
        shm_size_mb=_megabytes(reader, body.get("shm_size"), f"{name}.shm_size", 1, MAX_MEMORY_MB),
        tmpfs=_tmpfs(reader, name, body.get("tmpfs")),
        extra_hosts=_extra_hosts(reader, name, body.get("extra_hosts")),
        cpus=limits["cpus"],
        memory_mb=limits["memory_mb"],
        pids_limit=limits["pids_limit"],
        healthcheck=_healthcheck(reader, name, body.get("healthcheck")),
        depends_on=_depends_on(reader, name, body.get("depends_on"), known),
        cap_add=_capabilities(reader, name, body.get("cap_add")),
        init=reader.flag(body.get("init", False), f"{name}.init"),
    )


def _check_graph(reader: _Reader, main: str, sidecars: list[Sidecar]) -> None:
    """No sidecar depends on the main service (it starts last), and no dependencies go round in a circle."""
    edges = {sidecar.name: [d.service for d in sidecar.depends_on] for sidecar in sidecars}
    for sidecar in sidecars:
        if main in edges[sidecar.name]:
            raise TaskError(
                f"{reader.file}: service '{sidecar.name}' depends on '{main}', the agent's container, which starts "
                "after every other service; drop that dependency"
            )
    state: dict[str, int] = {}  # 1: being visited, 2: done

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            raise TaskError(f"{reader.file}: services depend on each other in a circle: {' -> '.join(path)}")
        state[name] = 1
        for following in edges[name]:
            visit(following, [*path, following])
        state[name] = 2

    for name in edges:
        visit(name, [name])


# --- one setting at a time -----------------------------------------------------------------------


def _table(reader: _Reader, value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TaskError(f"{reader.file}: {what} must be a table, not {type(value).__name__}")
    return {str(key): item for key, item in value.items()}


def _build(reader: _Reader, name: str, value: Any) -> Build:
    if isinstance(value, str):
        value = {"context": value}
    body = _table(reader, value, f"'{name}.build'")
    for key in body:
        if key not in ("context", "dockerfile", "args"):
            raise reader.refuse(f"'build.{key}' of service '{name}'")
    context = reader.folder / reader.text(body.get("context", "."), f"{name}.build.context")
    dockerfile = reader.text(body.get("dockerfile", "Dockerfile"), f"{name}.build.dockerfile")
    return Build(context.resolve(), dockerfile, _pairs(reader, body.get("args"), f"{name}.build.args"))


def _aliases(reader: _Reader, name: str, body: Mapping[str, Any]) -> tuple[str, ...]:
    """The service's other names on the episode's network: its hostname and container name, as in compose."""
    names = {reader.text(body[key], f"{name}.{key}") for key in ("hostname", "container_name") if body.get(key)}
    return tuple(sorted(names - {name}))


def _harness_mounts_only(reader: _Reader, name: str, volumes: Any) -> None:
    """The harness mounts its log folders into the agent's container; a task's own volumes are not supported."""
    for volume in volumes or []:
        source = volume.get("source", "") if isinstance(volume, Mapping) else str(volume).split(":", 1)[0]
        if not _HARNESS_MOUNT.match(str(source)):
            raise reader.refuse(f"volume {volume!r} of service '{name}' (only the harness's log folders are)")


def _environment(reader: _Reader, name: str, body: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    merged: dict[str, str] = {}
    files = body.get("env_file") or []
    for entry in [files] if isinstance(files, (str, Mapping)) else files:
        path = entry.get("path") if isinstance(entry, Mapping) else entry
        required = entry.get("required", True) if isinstance(entry, Mapping) else True
        file = reader.folder / reader.text(path, f"{name}.env_file")
        if file.is_file():
            merged.update(_env_file(reader, file))
        elif required:
            raise TaskError(f"{reader.file}: service '{name}' reads env_file {file}, which does not exist")
    merged.update(_pairs(reader, body.get("environment"), f"{name}.environment", from_host=True))
    return tuple(merged.items())


def _env_file(reader: _Reader, file: Path) -> dict[str, str]:
    values = {}
    for line in file.read_text(encoding="utf-8", errors="replace").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.removeprefix("export ").partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key.strip()] = substitute(value, reader.variables, compose=True)
    return values


def _pairs(reader: _Reader, value: Any, what: str, from_host: bool = False) -> tuple[tuple[str, str], ...]:
    """A compose mapping or ``KEY=VALUE`` list; with ``from_host``, a bare ``KEY`` takes the host's value."""
    pairs: dict[str, str | None] = {}
    if isinstance(value, Mapping):
        pairs = {str(k): None if v is None else reader.scalar(v, f"{what}.{k}") for k, v in value.items()}
    elif isinstance(value, list):
        for item in value:
            key, sep, text = reader.text(item, what).partition("=")
            pairs[key] = text if sep else None
    elif value is not None:
        raise TaskError(f"{reader.file}: '{what}' must be a table or a list of KEY=VALUE")
    resolved: dict[str, str] = {}
    for key, given in pairs.items():
        if given is None:
            if from_host and key in reader.variables:
                resolved[key] = reader.variables[key]
            continue
        resolved[key] = given
    return tuple(resolved.items())


def _argv(reader: _Reader, value: Any, what: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, list):
        return tuple(reader.scalar(item, what) for item in value)
    return tuple(shlex.split(reader.text(value, what)))


def _limits(reader: _Reader, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
    deploy = _table(reader, body.get("deploy"), f"'{name}.deploy'")
    if reader.number(deploy.get("replicas", 1), f"{name}.deploy.replicas", 0, MAX_PIDS) != 1:
        raise reader.refuse(f"deploy.replicas of service '{name}' other than 1")
    limits = _table(reader, _table(reader, deploy.get("resources"), f"'{name}.deploy.resources'").get("limits"),
                    f"'{name}.deploy.resources.limits'")  # fmt: skip
    cpus = limits.get("cpus", body.get("cpus"))
    memory = limits.get("memory", body.get("mem_limit"))
    pids = limits.get("pids", body.get("pids_limit"))
    return {
        "cpus": None if cpus is None else reader.number(cpus, f"{name}.cpus", MIN_CPUS, MAX_CPUS),
        "memory_mb": _megabytes(reader, memory, f"{name}.memory", MIN_MEMORY_MB, MAX_MEMORY_MB),
        "pids_limit": None if pids is None else int(reader.number(pids, f"{name}.pids_limit", MIN_PIDS, MAX_PIDS)),
    }


def _megabytes(reader: _Reader, value: Any, what: str, low: int, high: int) -> int | None:
    """A compose size (bytes as a number, or ``"512m"``, ``"2g"``, ``"64mb"``) in whole megabytes, rounded up."""
    if value is None:
        return None
    match = _SIZE.match(reader.scalar(value, what))
    if match is None:
        raise TaskError(f"{reader.file}: '{what}' must be a size like \"512m\" or \"2g\", not {value!r}")
    size = float(match.group(1)) * _BYTES_PER_UNIT[match.group(2).lower()]
    megabytes = max(1, -(-int(size) // (1 << 20)))
    if not low <= megabytes <= high:
        raise TaskError(f"{reader.file}: '{what}' is {value!r}, outside the usable range {low} MB to {high} MB")
    return megabytes


def _tmpfs(reader: _Reader, name: str, value: Any) -> tuple[tuple[str, str], ...]:
    entries = [value] if isinstance(value, str) else value or []
    mounts = []
    for entry in entries:
        path, _, options = reader.text(entry, f"{name}.tmpfs").partition(":")
        if not path.startswith("/"):
            raise TaskError(f"{reader.file}: tmpfs {entry!r} of service '{name}' must be an absolute path")
        mounts.append((path, options))
    return tuple(mounts)


def _extra_hosts(reader: _Reader, name: str, value: Any) -> tuple[tuple[str, str], ...]:
    if isinstance(value, Mapping):
        return tuple((str(host), reader.scalar(address, f"{name}.extra_hosts")) for host, address in value.items())
    hosts = []
    for entry in value or []:
        text = reader.text(entry, f"{name}.extra_hosts")
        host, sep, address = text.partition("=") if "=" in text else text.partition(":")
        if not sep or not host or not address:
            raise TaskError(f"{reader.file}: extra_hosts entry {text!r} of service '{name}' must be HOST:ADDRESS")
        hosts.append((host, address))
    return tuple(hosts)


def _healthcheck(reader: _Reader, name: str, value: Any) -> Healthcheck | None:
    if value is None:
        return None
    body = _table(reader, value, f"'{name}.healthcheck'")
    if reader.flag(body.get("disable", False), f"{name}.healthcheck.disable"):
        return Healthcheck(("NONE",))
    test = body.get("test")
    if isinstance(test, str):
        form: tuple[str, ...] = ("CMD-SHELL", reader.text(test, f"{name}.healthcheck.test"))
    elif isinstance(test, list) and test and str(test[0]) in ("CMD", "CMD-SHELL", "NONE"):
        form = tuple(reader.scalar(item, f"{name}.healthcheck.test") for item in test)
    elif test is None:
        form = ()  # the image's own HEALTHCHECK, with these timings
    else:
        raise TaskError(f"{reader.file}: '{name}.healthcheck.test' must be a string or a list starting with CMD, "
                        "CMD-SHELL or NONE")  # fmt: skip
    defaults = Healthcheck(form)
    return Healthcheck(
        test=form,
        interval_s=reader.duration(body.get("interval"), f"{name}.healthcheck.interval", defaults.interval_s),
        timeout_s=reader.duration(body.get("timeout"), f"{name}.healthcheck.timeout", defaults.timeout_s),
        retries=int(reader.number(body.get("retries", defaults.retries), f"{name}.healthcheck.retries", 1, 10_000)),
        start_period_s=reader.duration(body.get("start_period"), f"{name}.healthcheck.start_period", 0.0),
    )


def _depends_on(reader: _Reader, name: str, value: Any, known: set[str] | None) -> tuple[Dependency, ...]:
    """Dependencies in compose's list or table form; with ``known``, unknown services are refused here."""
    if value is None:
        return ()
    if isinstance(value, list):
        entries: dict[str, Mapping[str, Any]] = {reader.text(item, f"{name}.depends_on"): {} for item in value}
    else:
        entries = {str(k): _table(reader, v, f"'{name}.depends_on.{k}'") for k, v in _table(reader, value, "").items()}
    dependencies = []
    for service, options in entries.items():
        condition_text = reader.text(options.get("condition", Condition.STARTED.value), f"{name}.depends_on.{service}")
        try:
            condition = Condition(condition_text)
        except ValueError:
            raise TaskError(f"{reader.file}: service '{name}' waits for {service!r} to be {condition_text!r}; use "
                            f"one of {', '.join(c.value for c in Condition)}") from None  # fmt: skip
        if known is not None and service not in known:
            if options.get("required", True) is False:
                continue
            raise TaskError(f"{reader.file}: service '{name}' depends on an unknown service '{service}'")
        dependencies.append(Dependency(service, condition))
    return tuple(dependencies)


def _capabilities(reader: _Reader, name: str, value: Any) -> tuple[str, ...]:
    capabilities = []
    for entry in value or []:
        capability = reader.text(entry, f"{name}.cap_add").upper().removeprefix("CAP_")
        if capability not in DOCKER_DEFAULT_CAPABILITIES:
            raise reader.refuse(f"cap_add {capability} of service '{name}' (only Docker's default capabilities are)")
        capabilities.append(capability)
    return tuple(capabilities)


class _Reader:
    """Scalars of one compose file, read with its variables resolved and errors naming the file and setting."""

    def __init__(self, file: Path, variables: Mapping[str, str]) -> None:
        self.file, self.folder, self.variables = file, file.parent, variables

    def refuse(self, what: str) -> TaskError:
        return TaskError(f"{self.file}: {what} is not supported by terminus-env, so this task cannot run as written")

    def check_keys(self, name: str, body: Mapping[str, Any], allowed: frozenset[str] | set[str]) -> None:
        for key in body:
            if key not in allowed and not key.startswith("x-"):
                raise self.refuse(f"setting '{key}' of service '{name}'")

    def scalar(self, value: Any, what: str) -> str:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise TaskError(f"{self.file}: '{what}' must be a string or a number, not {value!r}")
        return self.text(value, what) if isinstance(value, str) else str(value)

    def text(self, value: Any, what: str) -> str:
        if not isinstance(value, str):
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return str(value)
            raise TaskError(f"{self.file}: '{what}' must be a string, not {value!r}")
        try:
            return substitute(value, self.variables, compose=True)
        except TemplateError as exc:
            raise TaskError(f"{self.file}: '{what}': {exc}") from None

    def optional_text(self, value: Any, what: str) -> str | None:
        return None if value is None else self.text(value, what)

    def flag(self, value: Any, what: str) -> bool:
        if isinstance(value, str):
            value = {"true": True, "false": False}.get(self.text(value, what).strip().lower(), value)
        if not isinstance(value, bool):
            raise TaskError(f"{self.file}: '{what}' must be true or false, not {value!r}")
        return value

    def number(self, value: Any, what: str, low: float, high: float) -> float:
        try:
            number = float(self.scalar(value, what))
        except ValueError:
            raise TaskError(f"{self.file}: '{what}' must be a number, not {value!r}") from None
        if not low <= number <= high:
            raise TaskError(f"{self.file}: '{what}' is {value!r}, outside the usable range {low:g} to {high:g}")
        return number

    def duration(self, value: Any, what: str, default: float) -> float:
        """A Go duration as compose writes them (``"1m30s"``, ``"500ms"``); a plain number is seconds."""
        if value is None:
            return default
        text = self.scalar(value, what).strip()
        if re.fullmatch(r"\d+(\.\d+)?", text):
            seconds = float(text)
        elif re.fullmatch(f"(?:{_DURATION.pattern})+", text):
            seconds = sum(float(n) * _SECONDS_PER_UNIT[unit] for n, unit in _DURATION.findall(text))
        else:
            raise TaskError(f"{self.file}: '{what}' must be a duration like \"10s\" or \"1m30s\", not {value!r}")
        if seconds > MAX_TIMEOUT_S:
            raise TaskError(f"{self.file}: '{what}' is {value!r}, longer than {MAX_TIMEOUT_S:g} s")
        return seconds
