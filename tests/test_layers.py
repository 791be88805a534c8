"""The package's floors: no module imports one on a higher floor, at module level or inside a function; and the
folders show the floors, so a reader sees the layers in the tree.

The floors, lowest first, are listed in docs/development.md; a module's floor is that of the longest prefix below
that names it. A new module must be placed here, or the test says where it is missing."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "terminus_env"

FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("errors", "config", "utils", "__version__")),
    ("protocol and rules", ("protocol", "rules")),
    ("sandbox", ("sandbox",)),
    ("serving", ("serving",)),
    ("tasks", ("tasks",)),
    ("env", ("env",)),
    ("rollout", ("rollout",)),
    ("records", ("records", "training")),
    ("applications", ("audit", "cli.check", "cli.image_prune", "cli.evaluate", "cli.tiny_model", "viewer",
                      "integrations")),  # fmt: skip
    ("command line", ("cli", "__init__")),
)
"""Each floor and the modules on it, by dotted name under ``terminus_env`` (a package's name covers its modules)."""

TOP_MODULES = {"__init__", "env", "rules", "config", "errors", "training"}
"""The only modules loose at the top of the package; everything else lives in the folder of its floor."""

EXEMPT = {"sandbox.inside"}
"""The daemon that runs inside containers, shipped into them as source: it imports nothing of the package but its
own modules, relatively (checked below)."""


def _floor(name: str, floors: tuple[tuple[str, tuple[str, ...]], ...] = FLOORS) -> int | None:
    best, floor = -1, None
    for index, (_, prefixes) in enumerate(floors):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
                best, floor = len(prefix), index
    return floor


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts) or "__init__"
        if not any(name == e or name.startswith(e + ".") for e in EXEMPT):
            found[name] = path
    return found


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "terminus_env":  # `from terminus_env import config`: the module, or a root name
                names |= {f"terminus_env.{alias.name}" for alias in node.names}
            else:
                names.add(node.module)
    return {name.removeprefix("terminus_env.") for name in names if name.startswith("terminus_env.")}


def test_every_module_has_a_floor():
    assert [name for name in _modules() if _floor(name) is None] == []


def test_no_module_imports_from_a_higher_floor():
    upward = []
    for name, path in _modules().items():
        mine = _floor(name)
        assert mine is not None
        for imported in sorted(_imports(path)):
            theirs = _floor(imported)
            if theirs is not None and theirs > mine:
                upward.append(f"{name} ({FLOORS[mine][0]}) imports {imported} ({FLOORS[theirs][0]})")
    assert upward == []


def _loose_modules(package: Path) -> list[str]:
    """The modules at the top of ``package`` that are not among ``TOP_MODULES``."""
    return sorted(path.stem for path in package.glob("*.py") if path.stem not in TOP_MODULES)


def _mixed_folders(names: Iterable[str], floor: Callable[[str], int | None]) -> list[str]:
    """The top-level folders whose modules span floors. A folder's own ``__init__`` and ``__main__`` are left out:
    they may sit above its modules (``cli``: the command line over the commands beside it)."""
    by_folder: dict[str, set[int | None]] = {}
    for name in names:
        folder, _, module = name.partition(".")
        if module and module != "__main__":
            by_folder.setdefault(folder, set()).add(floor(name))
    return [f"{folder}/ spans floors {sorted(floors, key=str)}" for folder, floors in sorted(by_folder.items())
            if len(floors) > 1]  # fmt: skip


def test_the_top_of_the_package_holds_only_packages_and_the_named_modules():
    assert _loose_modules(PACKAGE) == []
    folders = [path for path in PACKAGE.iterdir() if path.is_dir() and not path.name.startswith("__")]
    assert folders and [path.name for path in folders if not (path / "__init__.py").is_file()] == []


def test_each_folder_holds_one_floor():
    assert _mixed_folders(_modules(), _floor) == []


def test_the_folder_checks_see_a_loose_module_and_a_mixed_folder(tmp_path):
    """The checks themselves: a helper left at the top is found, and so is a command kept in the tasks' folder."""
    for name in [*TOP_MODULES, "helpers"]:
        (tmp_path / f"{name}.py").write_text("")
    assert _loose_modules(tmp_path) == ["helpers"]
    old = (("tasks", ("tasks",)), ("applications", ("tasks.check",)))
    assert _mixed_folders(["tasks", "tasks.loader", "tasks.check"], lambda name: _floor(name, old)) == [
        "tasks/ spans floors [0, 1]"
    ]


def test_the_daemon_inside_containers_imports_only_itself():
    inside = sorted((PACKAGE / "sandbox" / "inside").glob("*.py"))
    assert inside and {name for path in inside for name in _imports(path)} == set()


def test_the_floors_see_a_planted_upward_import(tmp_path):
    """The check itself: a sandbox module that imports the env is found (the test can fail)."""
    planted = tmp_path / "planted.py"
    planted.write_text("def f():\n    from terminus_env.env import TerminusEnv\n    return TerminusEnv\n")
    assert "env" in _imports(planted)
    assert _floor("env") > _floor("sandbox.planted")
