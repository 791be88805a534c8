"""Read task folders (Harbor / Terminal-Bench 2 and Terminal-Bench 1) into `Task` records.

Unknown fields are kept in `Task.metadata` so newer task files still load; fields we do
use are validated here, so a broken task fails at load time with the file and field named.
"""

from __future__ import annotations

import difflib
import math
import re
import sys
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, overload

import yaml

from terminus_env.config import host_environment
from terminus_env.utils.limits import (
    MAX_CPUS,
    MAX_MEMORY_MB,
    MAX_STORAGE_MB,
    MAX_TIMEOUT_S,
    MIN_CPUS,
    MIN_MEMORY_MB,
    MIN_STORAGE_MB,
)
from terminus_env.tasks.task_compose import read_harbor_compose, read_tb1_compose
from terminus_env.tasks.harbor_fields import NetworkMode, mcp_section, network_mode, refusal, unknown_fields
from terminus_env.tasks.task import Task, TaskError
from terminus_env.tasks.templates import TemplateError, substitute

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

# Harbor's defaults (see the task-format reference).
HARBOR_VERIFIER_TIMEOUT_S = 600.0
HARBOR_BUILD_TIMEOUT_S = 600.0
# Terminal-Bench 1's defaults.
TB1_AGENT_TIMEOUT_S = 360.0
TB1_TEST_TIMEOUT_S = 60.0

_KNOWN_TB1 = {
    "instruction", "descriptions", "difficulty", "category", "tags", "parser_name", "max_agent_timeout_sec",
    "max_test_timeout_sec", "run_tests_in_same_shell", "author_email", "author_name", "disable_asciinema",
    "estimated_duration_sec", "expert_time_estimate_min", "junior_time_estimate_min",
}  # fmt: skip
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_MB_PER_UNIT = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}
# The build copies the repository's tasks/ into this folder of the terminus_env.tasks package (pyproject.toml).
SHIPPED_SUITE = "suite"


def shipped_tasks_dir() -> Path:
    """The shipped suite: package data in an installed wheel, the checkout's `tasks/` in an editable install.

    Tasks are written in `tasks/` at the repository root; only a build copies them into the package, so a
    checkout (where `pip install -e .` points) has no packaged copy and its `tasks/` is the suite.
    """
    packaged = resources.files("terminus_env.tasks").joinpath(SHIPPED_SUITE)
    if isinstance(packaged, Path) and packaged.is_dir():
        return packaged
    checkout = Path(__file__).resolve().parents[2] / "tasks"
    if checkout.is_dir():
        return checkout
    raise TaskError(
        f"this installation of terminus-env has no shipped suite ({packaged} is missing): reinstall it from a "
        "wheel or sdist (`pip install --force-reinstall terminus-env`), or pass a folder of tasks"
    )


def is_task_dir(path: Path) -> bool:
    return (path / "task.toml").is_file() or (path / "task.yaml").is_file()


def task_dirs(folder: Path, names: list[str] | None = None) -> list[Path]:
    """The task folders directly inside `folder` (only those called `names`, in that order, if given)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TaskError(f"{folder}: not a folder of tasks")
    found = {p.name: p for p in sorted(folder.iterdir()) if p.is_dir() and is_task_dir(p)}
    if not names:
        return list(found.values())
    missing = [name for name in names if name not in found]
    if missing:
        raise TaskError(f"{folder}: no task named {', '.join(missing)}; known: {', '.join(found) or 'none'}")
    return [found[name] for name in names]


def load_tasks(folder: Path, names: list[str] | None = None) -> list[Task]:
    """Every task in `folder` sorted by name (or those called `names`); the first broken one raises `TaskError`."""
    return [load_task(path) for path in task_dirs(folder, names)]


def load_task(path: Path) -> Task:
    """Load one task folder in whichever format it is written."""
    path = Path(path).resolve()
    if (path / "task.toml").is_file():
        return _load_harbor(path)
    if (path / "task.yaml").is_file():
        return _load_tb1(path)
    raise TaskError(f"{path}: no task.toml (Harbor) or task.yaml (Terminal-Bench 1) in this folder")


def find_task(name_or_path: str | Path, search: list[Path] | None = None) -> Task:
    """A task given by folder path, or by name inside the `search` folders (default: the shipped suite)."""
    candidate = Path(name_or_path)
    if candidate.is_dir():
        return load_task(candidate)
    folders = [shipped_tasks_dir()] if search is None else [Path(p) for p in search]
    known: list[str] = []
    for folder in folders:
        if is_task_dir(folder / str(name_or_path)):
            return load_task(folder / str(name_or_path))
        if folder.is_dir():
            known += [p.name for p in task_dirs(folder)]
    hint = difflib.get_close_matches(str(name_or_path), known, n=3)
    suggestion = f"; did you mean {', '.join(hint)}?" if hint else f"; known tasks: {', '.join(known) or 'none'}"
    where = ", ".join(str(f) for f in folders)
    raise TaskError(f"no task named {str(name_or_path)!r} in {where}{suggestion}")


def _read_text(file: Path) -> str:
    try:
        return file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TaskError(f"{file}: not UTF-8 text ({exc}); save it as UTF-8") from exc


# --- Harbor / Terminal-Bench 2 -------------------------------------------------------------------


def _load_harbor(path: Path) -> Task:
    toml_file = path / "task.toml"
    try:
        config_table = tomllib.loads(_read_text(toml_file))
    except tomllib.TOMLDecodeError as exc:
        raise TaskError(f"{toml_file}: TOML syntax error: {exc}") from exc
    fields = _Fields(toml_file, config_table)
    verifier, agent, environment = fields.table("verifier"), fields.table("agent"), fields.table("environment")
    network = _refuse_unsupported_harbor(path, config_table, environment)

    instruction_file = path / "instruction.md"
    if not instruction_file.is_file():
        raise TaskError(f"{instruction_file}: missing; every Harbor task needs instruction.md (the agent's task)")
    tests_dir = path / "tests"
    if not (tests_dir / "test.sh").is_file():
        raise TaskError(f"{tests_dir / 'test.sh'}: missing; the verifier must be tests/test.sh")

    docker_image = environment.string("docker_image")
    build_context = path / "environment"
    build_timeout = environment.seconds("build_timeout_sec", HARBOR_BUILD_TIMEOUT_S)
    cpus = environment.bounded("cpus", MIN_CPUS, MAX_CPUS)
    memory_mb = environment.megabytes("memory_mb", "memory", MIN_MEMORY_MB, MAX_MEMORY_MB)
    host = host_environment()
    compose = read_harbor_compose(
        build_context, path.name, prebuilt=docker_image is not None, cpus=cpus, memory_mb=memory_mb, host=host,
        build_timeout_s=build_timeout,
    )  # fmt: skip
    if docker_image is None and not (build_context / "Dockerfile").is_file():
        raise TaskError(f"{build_context / 'Dockerfile'}: missing and [environment] docker_image unset")

    solve = path / "solution" / "solve.sh"
    metadata = dict(fields.table("metadata").raw)
    if "task" in config_table:
        metadata["task"] = fields.table("task").raw
    unknown = unknown_fields(config_table)
    if unknown:
        metadata["unknown_fields"] = unknown
    try:
        mcp = mcp_section(environment.raw.get("mcp_servers"))
    except ValueError as exc:
        raise TaskError(f"{toml_file}: field 'environment.mcp_servers': {exc}") from None

    main = compose.environment
    return Task(
        name=path.name,
        instruction=_read_text(instruction_file) + (mcp or ""),
        path=path,
        source_format="harbor",
        tests_dir=tests_dir,
        verifier_script=tests_dir / "test.sh",
        solution_path=solve if solve.is_file() else None,
        build_context=build_context if (build_context / "Dockerfile").is_file() else None,
        docker_image=docker_image,
        agent_timeout_s=agent.seconds("timeout_sec", None),
        verifier_timeout_s=verifier.seconds("timeout_sec", HARBOR_VERIFIER_TIMEOUT_S),
        build_timeout_s=build_timeout,
        cpus=main.cpus if main.cpus is not None else cpus,  # Harbor lays the task's compose file last
        memory_mb=main.memory_mb if main.memory_mb is not None else memory_mb,
        storage_mb=environment.megabytes("storage_mb", "storage", MIN_STORAGE_MB, MAX_STORAGE_MB),
        allow_internet=network is not NetworkMode.NO_NETWORK and not main.no_network,
        env={**dict(main.env), **environment.template_map("env", host)},
        workdir=environment.string("workdir") or main.workdir,
        agent_user=agent.user("user"),
        verifier_env=verifier.template_map("env", host),
        verifier_user=verifier.user("user"),
        solution_env=fields.table("solution").template_map("env", host),
        metadata=metadata,
        notes=(
            *(() if solve.is_file() else (f"{solve} missing: the oracle cannot run",)),
            *compose.notes,
            *((f"fields outside Harbor's task.toml are ignored: {', '.join(unknown)}",) if unknown else ()),
        ),
        **compose.task_fields(),
    )


def _refuse_unsupported_harbor(
    path: Path, config_table: Mapping[str, Any], environment: _Fields
) -> NetworkMode | None:
    """Refuse, by name, what cannot run as a single Docker task, before anything else can be reported missing;
    return the task's one network policy (None: the default)."""
    if "steps" in config_table or (path / "steps").is_dir():
        where = "[[steps]] in task.toml" if "steps" in config_table else f"a {path / 'steps'} folder"
        raise TaskError(
            f"{path}: a multi-step task ({where}); multi-step tasks are not supported by terminus-env. Its top-level "
            "tests/test.sh, if any, does not grade the steps, so it is not run as a single task"
        )
    kind = environment.string("type")
    if kind is not None and kind != "docker":
        raise TaskError(
            f"{path / 'task.toml'}: field 'environment.type' is {kind!r}; terminus-env runs only Docker environments "
            "(type = \"docker\", or no type)"
        )
    mode, problem = network_mode(config_table)
    problem = refusal(config_table) or problem
    if problem is not None:
        raise TaskError(f"{path / 'task.toml'}: {problem}")
    return mode


# --- Terminal-Bench 1 ----------------------------------------------------------------------------


def _load_tb1(path: Path) -> Task:
    yaml_file = path / "task.yaml"
    try:
        config = yaml.safe_load(_read_text(yaml_file))
    except yaml.YAMLError as exc:
        raise TaskError(f"{yaml_file}: YAML syntax error: {exc}") from exc
    fields = _Fields(yaml_file, config if config is not None else {})

    instruction = fields.string("instruction") or _tb1_base_description(fields)
    if not instruction:
        raise TaskError(f"{yaml_file}: field 'instruction' is missing or empty")
    parser = fields.string("parser_name") or "pytest"
    if parser != "pytest":
        raise TaskError(f"{yaml_file}: field 'parser_name' is {parser!r}; only 'pytest' is supported")
    compose = read_tb1_compose(path, host=host_environment(), build_timeout_s=HARBOR_BUILD_TIMEOUT_S)
    main = compose.environment
    build_context = main.main_context or path  # the client's own folder, as in simple-web-scraper
    if not (build_context / "Dockerfile").is_file():
        where = "the folder its docker-compose.yaml builds the client from" if main.main_context else "its top"
        raise TaskError(f"{build_context / 'Dockerfile'}: missing; a Terminal-Bench 1 task builds from a Dockerfile "
                        f"in {where}")  # fmt: skip
    run_tests = path / "run-tests.sh"
    if not run_tests.is_file():
        raise TaskError(f"{run_tests}: missing; it is the Terminal-Bench 1 verifier")

    notes: list[str] = []
    solution = path / "solution.sh"
    if not solution.is_file():
        if (path / "solution.yaml").is_file():
            notes.append(f"{path / 'solution.yaml'}: command-list solutions are not supported; the oracle cannot run")
        else:
            notes.append(f"{solution} missing: the oracle cannot run")
    if fields.boolean("run_tests_in_same_shell", False):
        notes.append("run_tests_in_same_shell is ignored: tests always run in a fresh one-shot shell")

    metadata = {k: v for k, v in fields.raw.items() if k not in {"instruction", "descriptions"}}
    unknown = {k: v for k, v in fields.raw.items() if k not in _KNOWN_TB1}
    if unknown:
        metadata["unknown_fields"] = unknown
    notes.extend(compose.notes)
    return Task(
        name=path.name,
        instruction=instruction,
        path=path,
        source_format="terminal-bench-1",
        tests_dir=path / "tests",
        verifier_script=run_tests,
        solution_path=solution if solution.is_file() else None,
        build_context=build_context,
        agent_timeout_s=fields.seconds("max_agent_timeout_sec", TB1_AGENT_TIMEOUT_S),
        verifier_timeout_s=fields.seconds("max_test_timeout_sec", TB1_TEST_TIMEOUT_S),
        build_timeout_s=HARBOR_BUILD_TIMEOUT_S,
        cpus=main.cpus,
        memory_mb=main.memory_mb,
        allow_internet=not main.no_network,
        env=dict(main.env),
        workdir=main.workdir,
        verifier_env={"TEST_DIR": "/tests"},
        metadata=metadata,
        notes=tuple(notes),
        **compose.task_fields(),
    )


def _tb1_base_description(fields: _Fields) -> str | None:
    """Older Terminal-Bench 1 tasks hold the instruction in `descriptions`, under key `base`."""
    for entry in fields.raw.get("descriptions") or []:
        if isinstance(entry, Mapping) and entry.get("key") == "base" and isinstance(entry.get("description"), str):
            return entry["description"]
    return None


# --- typed field access --------------------------------------------------------------------------


class _Fields:
    """A table from a task file, read field by field with errors naming the file and field."""

    def __init__(self, file: Path, raw: Any, prefix: str = "") -> None:
        if not isinstance(raw, Mapping):
            raise TaskError(f"{file}: {prefix or 'the file'} must be a table of fields, not {type(raw).__name__}")
        self.file, self.raw, self.prefix = file, raw, prefix

    def _error(self, key: str, problem: str) -> TaskError:
        return TaskError(f"{self.file}: field '{self.prefix}{key}' {problem}")

    def table(self, key: str) -> _Fields:
        value = self.raw.get(key, {})
        if not isinstance(value, Mapping):
            raise self._error(key, f"must be a table, not {type(value).__name__}")
        return _Fields(self.file, value, f"{self.prefix}{key}.")

    def string(self, key: str) -> str | None:
        value = self.raw.get(key)
        if value is not None and not isinstance(value, str):
            raise self._error(key, f"must be a string, not {value!r}")
        return value

    def user(self, key: str) -> str | None:
        """A user by name, or by uid (Harbor takes both)."""
        value = self.raw.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return str(value)
        return self.string(key)

    def boolean(self, key: str, default: bool) -> bool:
        value = self.raw.get(key, default)
        if not isinstance(value, bool):
            raise self._error(key, f"must be true or false, not {value!r}")
        return value

    def bounded(self, key: str, low: float, high: float) -> float | None:
        """A number in [low, high]; TOML and YAML give numbers typed, so strings are refused."""
        value = self.raw.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self._error(key, f"must be a number between {_plain(low)} and {_plain(high)}, not {value!r}")
        if not low <= value <= high:
            raise self._error(key, f"is {value:g}, outside the usable range {_plain(low)} to {_plain(high)}")
        return float(value)

    @overload
    def seconds(self, key: str, default: float) -> float: ...
    @overload
    def seconds(self, key: str, default: None) -> float | None: ...
    def seconds(self, key: str, default: float | None) -> float | None:
        value = self.bounded(key, 1e-3, MAX_TIMEOUT_S)
        return default if value is None else value

    def megabytes(self, key: str, legacy: str, low: int, high: int) -> int | None:
        value = self.bounded(key, low, high)
        if value is not None:
            return int(value)
        size = self.raw.get(legacy)
        if size is None:
            return None
        match = _SIZE.match(size) if isinstance(size, str) else None
        if match is None or not match.group(2) or float(match.group(1)) <= 0:
            raise self._error(legacy, f"must be a size with a unit, like \"2G\" or \"512M\", not {size!r}")
        megabytes = max(1, round(float(match.group(1)) * _MB_PER_UNIT[match.group(2).lower()]))
        if not low <= megabytes <= high:
            raise self._error(legacy, f"is {size!r}, outside the usable range {low} MB to {high} MB")
        return megabytes

    def template_map(self, key: str, variables: Mapping[str, str]) -> dict[str, str]:
        """A string map whose values may hold ``${VAR}`` templates, resolved from ``variables`` as Harbor does."""
        resolved = {}
        for name, value in self.string_map(key).items():
            try:
                resolved[name] = substitute(value, variables, compose=False)
            except TemplateError as exc:
                raise self._error(f"{key}.{name}", f"cannot be resolved: {exc}") from None
        return resolved

    def string_map(self, key: str) -> dict[str, str]:
        table = self.raw.get(key, {})
        if not isinstance(table, Mapping):
            raise self._error(key, "must be a table of NAME = \"value\" strings")
        result = {}
        for name, value in table.items():
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise self._error(f"{key}.{name}", f"must be a string, not {value!r}")
            result[str(name)] = str(value)
        return result


def _plain(number: float) -> str:
    return f"{int(number):,}" if float(number).is_integer() else f"{number:g}"
