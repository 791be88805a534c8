"""How the in-container code (the ``inside`` package) reaches a container: its modules joined into one source, that
source and the same compiled by this Python passed in the main process's environment, and the command that runs
whichever the container's Python can.

One source rather than the package on ``sys.path``: a container has no copy of the package, and making one (a zip
written into the container, or a finder over a dict of modules) costs more at each start than executing one code
object does (docs/notes/sandbox.md has the figures). So the modules follow rules the join enforces (JoinError): they
import the standard library and each other only (``from .module import name``, at the top of a module, no alias),
their imports of each other form no cycle, and no two of them define the same name.
"""

from __future__ import annotations

import ast
import base64
import functools
import importlib.util
import marshal
import sys
import threading
import zlib
from collections.abc import Iterator
from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

SOURCE_VARIABLE, COMPILED_VARIABLE = "TERMINUS_SANDBOX_SOURCE", "TERMINUS_SANDBOX_COMPILED"
"""The container's main process reads its code from these variables (and removes them from its environment):
inside_source(), and the same compiled by this Python, each zlib-compressed and base64-encoded, then cut into parts
(``NAME`` holds how many, ``NAME0``... the parts) so that no variable passes the kernel's limit on one string."""
MAX_VARIABLE_CHARS = 65536
"""A part's length: Linux refuses to start a program with any one argument or variable over 128 KiB
(MAX_ARG_STRLEN), and the container's main process would not start at all."""
# The compiled code runs where the container's Python has this Python's bytecode magic (the same minor version);
# any other compiles the source. Compiling costs ~30 ms of a start's CPU here.
_MAIN_BOOTSTRAP = (
    "import os,sys,zlib,binascii,marshal;"
    "d=lambda n:zlib.decompress(binascii.a2b_base64(''.join([os.environ.pop(n+str(i)) for i in "
    "range(int(os.environ.pop(n)))])));"
    f"s,c=d({SOURCE_VARIABLE!r}),d({COMPILED_VARIABLE!r});"
    "m=sys.modules['_frozen_importlib_external'].MAGIC_NUMBER;"
    "exec(marshal.loads(c[len(m):]) if c[:len(m)]==m else compile(s,'terminus-sandbox','exec'))"
)
MAIN_COMMAND = ["python3", "-I", "-S", "-c", _MAIN_BOOTSTRAP, "main"]
ENTRY_MODULE = "main"
"""The module that runs the container's main process: the joined source ends with it."""
_STDLIB = frozenset(sys.stdlib_module_names)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
           ast.GeneratorExp)  # fmt: skip


class JoinError(ValueError):
    """The in-container modules break a rule of the join (the message says which and how to fix it)."""


@functools.cache
def inside_source() -> str:
    """The ``inside`` package as one source (read once per process; the package is never imported here)."""
    return joined_source(resources.files("terminus_env.sandbox").joinpath("inside"))


# Sandboxes start from worker threads: Python 3.11's parser may fail ("AST constructor recursion depth mismatch")
# when two threads parse or compile at once, so the variables are made under a lock, once.
_MAKING = threading.Lock()


def main_environment() -> dict[str, str]:
    """The variables MAIN_COMMAND reads inside_source() from (made once per process, whichever thread asks first)."""
    with _MAKING:
        return _main_environment()


@functools.cache
def _main_environment() -> dict[str, str]:
    return code_variables(inside_source())


def code_variables(source: str, magic: bytes = importlib.util.MAGIC_NUMBER) -> dict[str, str]:
    """``source`` and its code compiled here (``magic`` first), as MAIN_COMMAND reads them."""
    compiled = magic + marshal.dumps(compile(source, "terminus-sandbox", "exec"))
    return {**_parts(SOURCE_VARIABLE, source.encode()), **_parts(COMPILED_VARIABLE, compiled)}


def _parts(name: str, data: bytes) -> dict[str, str]:
    text = base64.b64encode(zlib.compress(data, 9)).decode()
    parts = [text[start : start + MAX_VARIABLE_CHARS] for start in range(0, len(text), MAX_VARIABLE_CHARS)]
    return {name: str(len(parts)), **{f"{name}{number}": part for number, part in enumerate(parts)}}


def joined_source(folder: Traversable) -> str:
    """The modules in ``folder`` as one source: each after the modules it imports, without those imports, ending
    with ENTRY_MODULE (whose ``__name__ == "__main__"`` guard then runs). ``__init__.py`` may hold a docstring only."""
    sources = {
        entry.name[: -len(".py")]: entry.read_text(encoding="utf-8")
        for entry in folder.iterdir()
        if entry.name.endswith(".py")
    }
    init = ast.parse(sources.pop("__init__", ""))
    if any(not _is_docstring(node) for node in init.body):
        raise JoinError("inside/__init__.py may hold a docstring only: it is not shipped; put code in a module")
    modules = {name: _Module(name, source) for name, source in sorted(sources.items())}
    if ENTRY_MODULE not in modules:
        raise JoinError(f"inside/ has no {ENTRY_MODULE}.py, the module that runs the container's main process")
    order = _import_order(modules)
    _check_names(modules)
    parts = ["# The in-container code (terminus_env/sandbox/inside), joined in import order by shipping.py.\n"]
    parts += [f"\n# ----- inside/{name}.py\n\n{modules[name].stripped()}" for name in order]
    return "".join(parts)


class _Module:
    """One module's source, its imports of the other modules, and the names it defines and imports at its top."""

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        tree = ast.parse(source, filename=f"inside/{name}.py")
        self.needs: dict[str, list[str]] = {}  # module -> names taken from it
        self.import_lines: set[int] = set()  # 1-based lines of the imports of other modules, left out when joined
        self.defined: set[str] = set()
        self.imported: set[str] = set()  # names bound by imports of the standard library
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level and node not in tree.body:
                raise JoinError(f"inside/{name}.py:{node.lineno}: import the other modules at the top of the module")
            if isinstance(node, ast.Import) or (isinstance(node, ast.ImportFrom) and not node.level):
                self._check_stdlib(node)
            if isinstance(node, ast.Global):  # a function's global binds a name of the one namespace
                self.defined.update(node.names)
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.level:
                self._take(node)
            else:
                for bound, by_import in _bound_names(node):
                    (self.imported if by_import else self.defined).add(bound)
        other_lines = {
            line for node in tree.body if not (isinstance(node, ast.ImportFrom) and node.level)
            for line in range(node.lineno, (node.end_lineno or node.lineno) + 1)
        }  # fmt: skip
        if other_lines & self.import_lines:
            raise JoinError(f"inside/{name}.py: put each import of another module on lines of its own")

    def _take(self, node: ast.ImportFrom) -> None:
        where = f"inside/{self.name}.py:{node.lineno}"
        if node.level != 1 or not node.module or "." in node.module:
            raise JoinError(f"{where}: import a sibling module by name (`from .module import name`)")
        if any(alias.asname or alias.name == "*" for alias in node.names):
            raise JoinError(f"{where}: import names as they are (no `as`, no `*`): the joined source has one namespace")
        self.needs.setdefault(node.module, []).extend(alias.name for alias in node.names)
        self.import_lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))

    def _check_stdlib(self, node: ast.Import | ast.ImportFrom) -> None:
        modules = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        for module in modules:
            if module.split(".")[0] not in _STDLIB:
                raise JoinError(
                    f"inside/{self.name}.py:{node.lineno}: {module!r} is not in the standard library; the "
                    "in-container code runs on the image's bare python3"
                )

    def stripped(self) -> str:
        return "".join(
            line if number not in self.import_lines else ""
            for number, line in enumerate(self.source.splitlines(keepends=True), 1)
        )


def _import_order(modules: dict[str, _Module]) -> list[str]:
    """Every module after those it imports (a depth-first walk from ENTRY_MODULE); raises on a cycle, an unknown
    module, or a module the entry module does not reach."""
    order: list[str] = []
    walking: list[str] = []

    def visit(name: str) -> None:
        if name in order:
            return
        if name in walking:
            raise JoinError(f"the in-container modules import each other in a cycle: {' -> '.join(walking + [name])}")
        walking.append(name)
        for needed, names in sorted(modules[name].needs.items()):
            if needed not in modules:
                raise JoinError(f"inside/{name}.py imports .{needed}, which is not a module of inside/")
            missing = sorted(set(names) - modules[needed].defined)
            if missing:
                raise JoinError(f"inside/{name}.py imports {', '.join(missing)} from .{needed}, which defines none")
            visit(needed)
        walking.pop()
        order.append(name)

    visit(ENTRY_MODULE)
    unreached = sorted(set(modules) - set(order))
    if unreached:
        listed = ", ".join(f"inside/{name}.py" for name in unreached)
        raise JoinError(f"{listed} would not ship: neither {ENTRY_MODULE}.py nor a module it imports imports it")
    return order


def _check_names(modules: dict[str, _Module]) -> None:
    """No name may be defined by two modules, nor defined by one and bound by another's import of the standard
    library: joined, the later would replace the earlier."""
    owner: dict[str, str] = {}
    for name, module in modules.items():
        for defined in module.defined:
            if defined in owner:
                raise JoinError(
                    f"inside/{owner[defined]}.py and inside/{name}.py both define {defined!r}; the joined source "
                    "has one namespace: rename one"
                )
            owner[defined] = name
    for name, module in modules.items():
        clashes = sorted(module.imported & set(owner))
        if clashes:
            raise JoinError(
                f"inside/{name}.py imports {clashes[0]!r}, which inside/{owner[clashes[0]]}.py defines; rename the "
                "definition"
            )


def _bound_names(node: ast.AST) -> Iterator[tuple[str, bool]]:
    """The module-level names a top-level statement binds, each with whether an import binds it (what a function, a
    class, a lambda or a comprehension binds inside itself stays its own)."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        yield node.name, False
        return
    if isinstance(node, ast.Import | ast.ImportFrom):
        for alias in node.names:
            yield (alias.asname or alias.name).split(".")[0], True
        return
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
        yield node.id, False
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield child.name, False
        elif isinstance(child, ast.ExceptHandler) and child.name:
            yield child.name, False
            yield from _bound_names(child)
        elif not isinstance(child, _SCOPES):
            yield from _bound_names(child)


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
