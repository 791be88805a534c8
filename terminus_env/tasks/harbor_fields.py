"""Every field of Harbor's ``task.toml`` and what terminus-env does with it: honours it, ignores it (it changes
nothing about an episode here), or refuses the task, naming the field, because it cannot run as its author meant.

The fields are Harbor 0.26.0's (``harbor.models.task.config.TaskConfig``), plus ``environment.type``, which real
tasks use (``cloudlab``, ``vm-cluster``). Pure rules over the parsed file; ``loader`` reads the values it honours.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any


class Handling(str, Enum):
    HONOURED = "honoured"
    IGNORED = "ignored"
    REFUSED = "refused"


@dataclass(frozen=True)
class FieldRule:
    handling: Handling
    why: str


class NetworkMode(str, Enum):
    """Harbor's network policies; ``allow_internet`` is the older spelling of the first two."""

    PUBLIC = "public"
    NO_NETWORK = "no-network"
    ALLOWLIST = "allowlist"


_H, _I, _R = Handling.HONOURED, Handling.IGNORED, Handling.REFUSED
_SAME_NETWORK = "`public` or `no-network`, where it agrees with the verifier's (one container, one network)"
_ALLOWLIST = "an allowlist needs a per-host egress filter, which terminus-env does not have; use no-network or public"
FIELDS: dict[str, FieldRule] = {
    "schema_version": FieldRule(_I, "the format's version; the fields below are read whatever it says"),
    "version": FieldRule(_I, "the older name of schema_version"),
    "source": FieldRule(_I, "where the task was published from; changes nothing about an episode"),
    "task": FieldRule(_I, "the package's name, version, description, authors and keywords: kept in Task.metadata"),
    "metadata": FieldRule(_H, "free-form; difficulty and category are shown by `tasks list`, all of it is kept"),
    "artifacts": FieldRule(_I, "files Harbor copies out of the container after a trial, for the record; with the "
                           "verifier in the agent's container they do not change the reward"),  # fmt: skip
    "steps": FieldRule(_R, "a multi-step task; its top-level tests/test.sh, if any, does not grade the steps"),
    "multi_step_reward_strategy": FieldRule(_I, "applies only to multi-step tasks, which are refused"),
    "solution.env": FieldRule(_H, "the oracle's environment in `tasks check`, `${VAR}` templates resolved from the "
                              "host (`eval --oracle` types the solution into the terminal, without it)"),  # fmt: skip
    "agent.timeout_sec": FieldRule(_H, "the agent's wall-clock limit (none by default)"),
    "agent.user": FieldRule(_H, "the user (name or uid) the terminal and the oracle run as (the image's USER)"),
    "agent.network_mode": FieldRule(_H, _SAME_NETWORK),
    "agent.allowed_hosts": FieldRule(_R, _ALLOWLIST),
    "verifier.timeout_sec": FieldRule(_H, "the verifier's limit (600 s by default)"),
    "verifier.env": FieldRule(_H, "the verifier's environment, `${VAR}` templates resolved from the host"),
    "verifier.user": FieldRule(_H, "the user (name or uid) the verifier runs as (root by default)"),
    "verifier.network_mode": FieldRule(_H, _SAME_NETWORK.replace("verifier's", "agent's")),
    "verifier.allowed_hosts": FieldRule(_R, _ALLOWLIST),
    "verifier.environment_mode": FieldRule(_H, "`shared` (the default) is how terminus-env grades; `separate` "
                                           "(a verifier container fed only artifacts) is refused"),  # fmt: skip
    "verifier.environment": FieldRule(_R, "it defines a verifier container of its own, and terminus-env runs the "
                                      "verifier in the agent's; run the task with Harbor"),  # fmt: skip
    "verifier.collect": FieldRule(_R, "its commands snapshot compose services for a separate verifier, which "
                                  "terminus-env does not have; run the task with Harbor"),  # fmt: skip
    "environment.build_timeout_sec": FieldRule(_H, "the image build's limit (600 s by default)"),
    "environment.docker_image": FieldRule(_H, "a prebuilt image, used when present locally or pullable"),
    "environment.os": FieldRule(_H, "`linux`; `windows` is refused (Linux containers only)"),
    "environment.cpus": FieldRule(_H, "the container's CPU limit (1 by default)"),
    "environment.memory_mb": FieldRule(_H, "the container's memory limit, swap equal to it (2048 MB by default)"),
    "environment.memory": FieldRule(_H, "the older `memory = \"2G\"` spelling of memory_mb"),
    "environment.storage_mb": FieldRule(_H, "the limit on what the container writes (10 GiB by default)"),
    "environment.storage": FieldRule(_H, "the older `storage = \"10G\"` spelling of storage_mb"),
    "environment.gpus": FieldRule(_H, "0 is honoured; more is refused: containers get no GPU"),
    "environment.gpu_types": FieldRule(_I, "which GPUs would do; meaningful only with gpus, which must be 0"),
    "environment.tpu": FieldRule(_R, "it asks for a TPU slice, and containers here get none; run the task where "
                                 "TPUs are"),  # fmt: skip
    "environment.mcp_servers": FieldRule(_H, "listed after the instruction, as Harbor's Terminus-2 lists them"),
    "environment.env": FieldRule(_H, "the container's environment, `${VAR}` templates resolved from the host"),
    "environment.skills_dir": FieldRule(_R, "Harbor's agents are told of the skills in it, and terminus-env's are "
                                        "not; name the skills in the instruction instead"),  # fmt: skip
    "environment.healthcheck": FieldRule(_R, "Harbor runs it until the environment is ready, before the agent "
                                         "starts, and terminus-env does not; make the image's ENTRYPOINT wait for "
                                         "readiness instead"),  # fmt: skip
    "environment.workdir": FieldRule(_H, "the working directory of the terminal, the oracle and the verifier"),
    "environment.allow_internet": FieldRule(_H, "the older spelling of network_mode public / no-network"),
    "environment.network_mode": FieldRule(_H, "`public` or `no-network`; `allowlist` is refused"),
    "environment.allowed_hosts": FieldRule(_R, _ALLOWLIST),
    "environment.type": FieldRule(_H, "`docker` (or absent); any other environment is refused"),
}
"""Every field, dotted; a table's name stands for all its keys (``task``, ``metadata``, ``steps``)."""
_TABLES = ("verifier", "agent", "environment", "solution")


def unknown_fields(config: Mapping[str, Any]) -> dict[str, Any]:
    """The fields outside Harbor's schema, dotted, with their values: kept for the user, changing nothing."""
    unknown = {key: value for key, value in config.items() if key not in FIELDS and key not in _TABLES}
    for table in _TABLES:
        body = config.get(table)
        if isinstance(body, Mapping):
            unknown.update({f"{table}.{k}": v for k, v in body.items() if f"{table}.{k}" not in FIELDS})
    return unknown


def refusal(config: Mapping[str, Any]) -> str | None:
    """Why a task cannot run here as written (the message names the field and says what to do), or None."""
    environment, verifier = _table(config, "environment"), _table(config, "verifier")
    for table, key in (("environment", "tpu"), ("environment", "skills_dir"), ("environment", "healthcheck"),
                       ("verifier", "environment"), ("verifier", "collect")):  # fmt: skip
        if _table(config, table).get(key) not in (None, [], {}):
            return f"field '{table}.{key}' is not supported by terminus-env: {FIELDS[f'{table}.{key}'].why}"
    mode = verifier.get("environment_mode")
    if mode == "separate":
        return (
            "field 'verifier.environment_mode' is 'separate' (a verifier container of its own, given only the "
            "artifacts); terminus-env runs the verifier in the agent's container, so this task cannot run as written"
        )
    if mode not in (None, "shared"):
        return f"field 'verifier.environment_mode' is {mode!r}; use 'shared' or 'separate'"
    gpus = environment.get("gpus")
    if gpus not in (None, 0):
        return f"field 'environment.gpus' is {gpus!r}: terminus-env gives containers no GPU; set it to 0"
    os_name = str(environment.get("os", "linux")).lower()
    if os_name != "linux":
        return f"field 'environment.os' is {os_name!r}: terminus-env runs Linux containers only"
    return None


def network_mode(config: Mapping[str, Any]) -> tuple[NetworkMode | None, str | None]:
    """The one network policy of the agent's and the verifier's phases (None: the default, public), or the
    reason this task cannot run: an allowlist, or phases whose policies differ (one container, one network)."""
    environment = _table(config, "environment")
    allow = environment.get("allow_internet")
    if allow is not None and not isinstance(allow, bool):
        return None, f"field 'environment.allow_internet' must be true or false, not {allow!r}"
    baseline = environment.get("network_mode")  # as in Harbor, it wins over the older allow_internet
    if baseline is None and allow is not None:
        baseline = NetworkMode.PUBLIC.value if allow else NetworkMode.NO_NETWORK.value
    phases = {
        "environment": baseline,
        "agent": _table(config, "agent").get("network_mode") or baseline,
        "verifier": _table(config, "verifier").get("network_mode") or baseline,
    }
    modes: dict[str, NetworkMode | None] = {}
    for phase, value in phases.items():
        if value is None:
            modes[phase] = None
            continue
        try:
            modes[phase] = NetworkMode(value)
        except ValueError:
            choices = ", ".join(mode.value for mode in NetworkMode)
            return None, f"field '{phase}.network_mode' is {value!r}; use one of {choices}"
        if modes[phase] is NetworkMode.ALLOWLIST:
            return None, (
                f"field '{phase}.network_mode' is 'allowlist' (only allowed_hosts reachable): terminus-env has no "
                "per-host egress filter; use 'public' or 'no-network'"
            )
    for phase in ("environment", "agent", "verifier"):
        if _table(config, phase).get("allowed_hosts") is not None:
            return None, f"field '{phase}.allowed_hosts' is set, yet no network_mode there is 'allowlist'"
    agent, verifier = modes["agent"] or NetworkMode.PUBLIC, modes["verifier"] or NetworkMode.PUBLIC
    if agent is not verifier:
        return None, (
            f"the agent's network is {agent.value!r} and the verifier's {verifier.value!r} (fields "
            "'agent.network_mode', 'verifier.network_mode', 'environment.network_mode'): terminus-env runs both in "
            "one container with one network policy; give them the same one"
        )
    return modes["agent"], None


def mcp_section(servers: Any) -> str | None:
    """The text Harbor's Terminus-2 adds after the instruction for ``environment.mcp_servers`` (None for none), or
    raises ValueError naming what is wrong with an entry."""
    if not servers:
        return None
    if not isinstance(servers, list):
        raise ValueError("must be a list of tables ([[environment.mcp_servers]])")
    lines = ["", "", "MCP servers available for this task:"]
    for index, server in enumerate(servers):
        if not isinstance(server, Mapping) or not isinstance(server.get("name"), str):
            raise ValueError(f"entry {index} needs a name")
        transport = {"http": "streamable-http"}.get(server.get("transport", "sse"), server.get("transport", "sse"))
        if transport == "stdio":
            command = " ".join(str(part) for part in [server.get("command", ""), *server.get("args", [])])
            lines.append(f"- {server['name']}: stdio transport, started with `{command.strip()}`")
        elif transport in ("sse", "streamable-http") and isinstance(server.get("url"), str):
            lines.append(f"- {server['name']}: {transport} transport at {server['url']}")
        else:
            raise ValueError(f"entry {server['name']!r} needs a url (sse, streamable-http) or a command (stdio)")
    return "\n".join(lines) + "\n"


def _table(config: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = config.get(name)
    return value if isinstance(value, Mapping) else {}
