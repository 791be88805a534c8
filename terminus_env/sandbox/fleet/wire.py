"""What travels between the pool and a host actor: requests' parts, answers, and errors as plain data.

Every answer of a host carries the sandbox's state (whether it is alive, the disk limit the agent broke), so the
pool's side knows it without an extra call. Errors travel as data and are rebuilt on the pool's side as the same
typed errors a local sandbox raises: pickling them as they are would call their constructors with the wrong
arguments (``DiskLimitExceeded(used_mb, limit_mb)``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from terminus_env.sandbox.errors import SandboxError, error_kinds


@dataclass(frozen=True)
class ImageSource:
    """A task's build context, to be built into an image on the host that runs the task.

    ``context`` holds one Ray object reference to the context's tar in the object store, inside a list so Ray
    does not fetch it with the request: only a host that lacks the image awaits it.
    """

    key: str
    """The context's hash (files only): the same on every host, unlike the tag, which hashes the parent image too."""
    name: str
    build_timeout_s: float
    context: list[Any] = field(compare=False, repr=False)


@dataclass(frozen=True)
class WireError:
    kind: str
    message: str
    fields: dict[str, Any] = field(default_factory=dict)
    lineage: tuple[str, ...] = ()
    """The error's sandbox-error ancestors, nearest first: the pool's side rebuilds the first one it knows, so a
    class only the host has loaded still arrives with its fault (an ``AgentCaused`` stays the agent's)."""


@dataclass(frozen=True)
class SandboxState:
    """What the pool's side keeps of a sandbox between calls."""

    alive: bool
    violation: WireError | None = None
    """The disk limit the agent broke, once the host's watchdog saw it."""
    daemon_stderr: str = ""
    """Sent only with an error: it tells the agent's doing (the OOM killer) from a bug of ours."""


@dataclass(frozen=True)
class Answer:
    """A host's answer to one call: a value or an error, and the sandbox's state after it."""

    value: Any = None
    error: WireError | None = None
    state: SandboxState | None = None


@dataclass(frozen=True)
class Started:
    sandbox_id: str
    image: str
    """The image the container runs on its host (the tag its build context was built into)."""


@dataclass(frozen=True)
class HostInfo:
    """What a host tells the pool when it starts."""

    node_id: str
    pid: int
    slots: int
    cpus: float
    memory_mb: float
    images: frozenset[str]
    """Images present on the host's Docker engine (tags), so prebuilt task images count for locality."""


def error_to_wire(exc: BaseException) -> WireError:
    if not isinstance(exc, SandboxError):  # a failure of the host's side
        return WireError("SandboxError", f"{type(exc).__name__}: {exc}")
    lineage = tuple(cls.__name__ for cls in type(exc).__mro__[1:] if issubclass(cls, SandboxError))
    return WireError(type(exc).__name__, str(exc), dict(vars(exc)), lineage)


def error_from_wire(wire: WireError) -> Exception:
    """The typed error the host raised, with its message and attributes, built without its constructor; an error
    of a class this side lacks is rebuilt as its nearest known ancestor, and anything else as a plain
    :class:`SandboxError` (the infrastructure's)."""
    kinds = error_kinds()
    cls = next((kinds[name] for name in (wire.kind, *wire.lineage) if name in kinds), SandboxError)
    error = cls.__new__(cls)
    exact = cls.__name__ == wire.kind
    Exception.__init__(error, wire.message if exact else f"{wire.kind}: {wire.message}")
    if exact:
        vars(error).update(wire.fields)
    return error
