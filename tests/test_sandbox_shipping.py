"""How the in-container code ships (shipping.py): the ``inside`` package joined into one source. It must import
nothing but the standard library, run in a bare interpreter, be the very code the host's tests import, and the join
must refuse a package it would break."""

from __future__ import annotations

import ast
import base64
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from terminus_env.sandbox import inside
from terminus_env.sandbox.shipping import (
    COMPILED_VARIABLE,
    MAIN_COMMAND,
    MAX_VARIABLE_CHARS,
    SOURCE_VARIABLE,
    JoinError,
    code_variables,
    joined_source,
    main_environment,
)

INSIDE = Path(inside.__file__).parent
MODULES = sorted(path.stem for path in INSIDE.glob("*.py") if path.stem != "__init__")
OPS = {"exec", "verify", "tmux", "commands", "send", "step", "capture", "read", "stop_agent", "ping", "lookup",
       "packages"}


def test_the_in_container_code_imports_the_standard_library_and_itself_only() -> None:
    for module in MODULES:
        tree = ast.parse((INSIDE / f"{module}.py").read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                assert node.level == 1 and node.module in MODULES, (module, node.module)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module]
                for name in names:
                    top = str(name).split(".")[0]
                    assert top in sys.stdlib_module_names and top != "terminus_env", (module, name)


def test_the_in_container_code_parses_with_the_oldest_grammar_an_image_may_hold() -> None:
    """An image's python3 may be 3.6: no walrus, no positional-only parameters (as far as the host's parser tells
    the grammars apart), and no `from __future__ import annotations`."""
    for module in MODULES:
        tree = ast.parse((INSIDE / f"{module}.py").read_text(encoding="utf-8"), feature_version=(3, 6))
        assert not any(isinstance(node, ast.ImportFrom) and node.module == "__future__" for node in tree.body)
    with pytest.raises(SyntaxError):
        ast.parse("if (n := 1):\n    pass\n", feature_version=(3, 6))


def test_the_joined_source_runs_in_a_bare_interpreter_and_loads_the_standard_library_only(tmp_path: Path) -> None:
    """Outside the checkout, with no site-packages: anything but the standard library would fail to import. Once
    started, the daemon refuses every import (the files on disk are the agent's)."""
    (tmp_path / "joined.py").write_text(joined_source(INSIDE))
    probe = (
        "import json, sys\n"
        "before = set(sys.modules)\n"
        "space = {'__name__': '__main__'}\n"
        "exec(compile(open('joined.py').read(), 'terminus-sandbox', 'exec'), space)\n"
        "sys.meta_path.insert(0, space['_NoImports'])\n"
        "try:\n"
        "    import csv\n"
        "    refused = ''\n"
        "except ImportError as exc:\n"
        "    refused = str(exc)\n"
        "print(json.dumps({'loaded': sorted(set(sys.modules) - before), 'ops': sorted(space['OPS']),\n"
        "                  'refused': refused}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", probe, "probe"], cwd=tmp_path, env={}, capture_output=True, text=True,
        check=True, timeout=60,
    )  # fmt: skip
    found = json.loads(out.stdout)
    assert set(found["ops"]) == OPS
    assert "ctypes" in found["loaded"] and "tarfile" in found["loaded"]
    outside = [name for name in found["loaded"] if name.split(".")[0] not in sys.stdlib_module_names]
    assert outside == []
    assert found["refused"] == "the sandbox daemon imports nothing after start-up (csv)"


def test_the_shipped_variables_load_with_the_main_command_where_nothing_is_asked() -> None:
    """MAIN_COMMAND with the variables as a container gets them, but not ``main``: the code loads, runs nothing."""
    command = [sys.executable, *MAIN_COMMAND[1:-1], "not-main"]
    done = subprocess.run(command, env=main_environment(), capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_no_shipped_variable_passes_the_kernels_limit_on_one_string() -> None:
    """Linux will not start a program with one variable over MAX_ARG_STRLEN (128 KiB, its ``NAME=`` and NUL
    included): the container would stop at once. The code grows; its parts must not."""
    variables = main_environment()
    assert len(variables) > 2  # the compiled code alone is over one part
    assert max(len(name) + 1 + len(value) + 1 for name, value in variables.items()) <= 128 * 1024


def test_a_variable_cut_in_many_parts_loads_whole() -> None:
    """Code much larger than one part (a long docstring of random text) still runs, from its parts joined in order."""
    filler = base64.b64encode(os.urandom(4 * MAX_VARIABLE_CHARS)).decode()
    program = f'"""{filler}"""\nimport sys\nprint("loaded", sys.argv[1:])\n'
    variables = code_variables(program, b"\0\0\r\n")  # a magic no Python has: the source runs, compiled there
    assert int(variables[SOURCE_VARIABLE]) > 1 and int(variables[COMPILED_VARIABLE]) > 1
    command = [sys.executable, *MAIN_COMMAND[1:-1], "main"]
    done = subprocess.run(command, env=variables, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "loaded ['main']")


def codes(code: types.CodeType) -> list[types.CodeType]:
    return [code] + [inner for const in code.co_consts if isinstance(const, types.CodeType) for inner in codes(const)]


def identity(value: object) -> object:
    """What a global name stands for, comparable across the two ways of loading the code."""
    if isinstance(value, types.FunctionType | type):
        return ("defined", value.__qualname__)
    if isinstance(value, types.ModuleType):
        return ("module", value.__name__)
    if isinstance(value, dict):
        return ("dict", sorted((repr(key), repr(identity(item))) for key, item in value.items()))
    if isinstance(value, tuple | list | frozenset | set):
        return (type(value).__name__, sorted(repr(identity(item)) for item in value))
    if isinstance(value, int | float | str | bytes | type(None)):
        return ("value", repr(value))
    return ("object", type(value).__name__)


def test_the_joined_source_is_the_code_the_host_tests_import() -> None:
    """Every function and class the host imports from the package has the same body in the source a container runs,
    and each global name it uses stands there for the same thing: tests of the package test what ships."""
    source = joined_source(INSIDE)
    joined_tree = ast.parse(source)
    shipped_defs = {
        node.name: ast.dump(node) for node in joined_tree.body if isinstance(node, ast.FunctionDef | ast.ClassDef)
    }
    space: dict[str, object] = {"__name__": "joined"}
    exec(compile(source, "terminus-sandbox", "exec"), space)
    checked = 0
    for module_name in MODULES:
        module = __import__(f"terminus_env.sandbox.inside.{module_name}", fromlist=["_"])
        tree = ast.parse((INSIDE / f"{module_name}.py").read_text(encoding="utf-8"))
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef | ast.ClassDef):
                continue
            assert shipped_defs[node.name] == ast.dump(node), f"{module_name}.{node.name}"
            value = vars(module)[node.name]
            functions = [value] if isinstance(value, types.FunctionType) else [
                getattr(member, "__func__", member) for member in vars(value).values()
            ]  # fmt: skip
            for function in functions:
                for code in codes(function.__code__) if isinstance(function, types.FunctionType) else []:
                    for name in code.co_names:
                        if name in vars(module) and not name.startswith("__"):  # a module's own dunders differ
                            assert identity(vars(module)[name]) == identity(space[name]), (module_name, node.name, name)
                            checked += 1
    assert checked > 400


def test_the_join_puts_each_module_after_those_it_imports_and_ends_with_main() -> None:
    source = joined_source(INSIDE)
    order = [line.split("/")[1][: -len(".py")] for line in source.splitlines() if line.startswith("# ----- inside/")]
    assert sorted(order) == MODULES and order[-1] == "main"
    for position, module in enumerate(order):
        tree = ast.parse((INSIDE / f"{module}.py").read_text(encoding="utf-8"))
        needed = {node.module for node in tree.body if isinstance(node, ast.ImportFrom) and node.level}
        assert needed <= set(order[:position]), module
    entry = 'if __name__ == "__main__" and sys.argv[1:2] == ["main"]:\n    main_process(sys.argv[2:])'
    assert source.rstrip().endswith(entry)
    assert "from ." not in source


def write_package(folder: Path, modules: dict[str, str]) -> Path:
    folder.mkdir()
    for name, source in modules.items():
        (folder / f"{name}.py").write_text(source)
    return folder


def test_a_join_strips_the_imports_of_each_other_and_keeps_scopes_apart(tmp_path: Path) -> None:
    package = write_package(tmp_path / "pkg", {
        "__init__": '"""Only words."""\n',
        "a": "import os\n\nX = [i for i in range(3)]\n\n\ndef f(value):\n    i = value\n    return i\n",
        "b": "from .a import (\n    X,\n    f,\n)\n\ni = 7\nY = f(len(X)) + i\n",
        "main": "import sys\n\nfrom .b import Y\n\nif __name__ == '__main__':\n    print(Y, sys.argv[1:])\n",
    })  # fmt: skip
    source = joined_source(package)
    space: dict[str, object] = {"__name__": "not-main"}
    exec(source, space)
    assert space["Y"] == 10 and "from ." not in source and "Only words" not in source


@pytest.mark.parametrize(
    ("modules", "message"),
    [
        ({"main": "from .a import A\n", "a": "from .b import B\nA = 1\n", "b": "from .a import A\nB = 2\n"},
         "in a cycle: main -> a -> b -> a"),
        ({"main": "from .a import X\nfrom .b import Y\n", "a": "X = 1\n", "b": "Y = 2\nX = 3\n"},
         "inside/a.py and inside/b.py both define 'X'"),
        ({"main": "from .a import X as Y\n", "a": "X = 1\n"}, "no `as`, no `*`"),
        ({"main": "from .a import *\n", "a": "X = 1\n"}, "no `as`, no `*`"),
        ({"main": "def f():\n    from .a import X\n", "a": "X = 1\n"},
         "main.py:2: import the other modules at the top"),
        ({"main": "import requests\n"}, "'requests' is not in the standard library"),
        ({"main": "from terminus_env import config\n"}, "'terminus_env' is not in the standard library"),
        ({"main": "X = 1\n", "__init__": "X = 2\n"}, "__init__.py may hold a docstring only"),
        ({"main": "X = 1\n", "lost": "Y = 1\n"}, "inside/lost.py would not ship"),
        ({"main": "from .a import Missing\n", "a": "X = 1\n"}, "imports Missing from .a, which defines none"),
        ({"main": "import signal\nfrom .a import X\n", "a": "X = 1\n\n\ndef signal():\n    pass\n"},
         "inside/main.py imports 'signal', which inside/a.py defines"),
        ({"main": "from ..other import X\n"}, "import a sibling module by name"),
        ({"daemon": "X = 1\n"}, "has no main.py"),
        ({"main": "from .a import X; Y = X\n", "a": "X = 1\n"},
         "put each import of another module on lines of its own"),
        ({"main": "from .a import f\n", "a": "def f():\n    global Z\n    Z = 1\n", "b": "Z = 2\n"}, "would not ship"),
        ({"main": "from .a import f\nfrom .b import Z\n", "a": "def f():\n    global Z\n    Z = 1\n", "b": "Z = 2\n"},
         "both define 'Z'"),
    ],
)  # fmt: skip
def test_the_join_refuses_what_one_namespace_would_break(tmp_path: Path, modules: dict[str, str], message: str) -> None:
    with pytest.raises(JoinError, match=re.escape(message)):
        joined_source(write_package(tmp_path / "pkg", modules))
