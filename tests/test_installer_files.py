"""Installer files are proved by their content (terminus_env/sandbox/inside/installer_files.py): the files and lines
setuptools writes prove, made here offline by the setuptools this environment holds, and each disguise fails: a
genuine file with a line added, a finder whose table runs code or that gains a statement, ``.pth`` lines that carry a
payload. The digests themselves come from scripts/installer-hashes.py, which runs the installers' releases."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from setuptools import __version__ as setuptools_version
from setuptools.command.editable_wheel import _finder_template
from setuptools.namespaces import Installer

from terminus_env.sandbox.inside import installer_hashes
from terminus_env.sandbox.inside.installer_files import (
    INSTALLER_HASHES,
    MAX_PROVEN_BYTES,
    installer_hook_candidate,
    installer_pth_line,
    normal_finder,
    proven_installer_file,
)

STALE = f"setuptools {setuptools_version} is newer than the hashes: rerun scripts/installer-hashes.py"
FINDER_PATH = "/usr/lib/python3/site-packages/__editable___demo_pkg_0_1_finder.py"
PAYLOAD = "__import__('os').system('touch /tmp/owned')"


def distutils_hack_files() -> list[Path]:
    spec = importlib.util.find_spec("_distutils_hack")
    assert spec is not None and spec.origin is not None, "setuptools installs _distutils_hack next to itself"
    return sorted(Path(spec.origin).parent.glob("*.py"))


def genuine_finder(mapping: dict[str, str] | None = None, namespaces: dict[str, list[str]] | None = None) -> bytes:
    """The finder setuptools writes for an editable install, from setuptools' own template."""
    mapping = {"demo_pkg": "/src/demo/demo_pkg", "demo_mod": "/src/demo/demo_mod.py"} if mapping is None else mapping
    namespaces = {"demo_ns": ["/src/demo/demo_ns"]} if namespaces is None else namespaces
    return _finder_template("__editable__.demo_pkg-0.1.finder", mapping, namespaces).encode()


def genuine_nspkg_line(package: str) -> str:
    """The line setuptools writes into a ``*-nspkg.pth`` for one namespace package."""
    return Installer()._gen_nspkg_line(package).rstrip("\n")


def replace_table(content: bytes, table: str, value: str) -> bytes:
    lines = content.decode().split("\n")
    index = next(index for index, line in enumerate(lines) if line.startswith(table))
    lines[index] = lines[index][: lines[index].index(" = ") + 3] + value
    return "\n".join(lines).encode()


# --- what the installers write proves -------------------------------------------------------------------------------


def test_the_hashes_module_is_plain_literals_for_python_3_6() -> None:
    source = Path(installer_hashes.__file__).read_text()
    tree = ast.parse(source, feature_version=(3, 6))
    assignment = tree.body[-1]
    assert isinstance(assignment, ast.Assign) and isinstance(assignment.value, ast.Call)
    digests = ast.literal_eval(assignment.value.args[0])
    assert digests == set(INSTALLER_HASHES) and len(digests) > 10
    assert all(re.fullmatch(r"[0-9a-f]{64}", digest) for digest in digests)
    for tool in ("uv", "virtualenv", "setuptools"):
        assert f"# {tool} " in source, f"the hashes name no {tool} release"


def test_setuptools_distutils_hack_files_prove() -> None:
    files = distutils_hack_files()
    assert {path.name for path in files} >= {"__init__.py", "override.py"}
    for path in files:
        assert installer_hook_candidate(str(path))
        assert proven_installer_file(str(path), path.read_bytes()), STALE


def test_setuptools_distutils_precedence_line_is_an_installer_line() -> None:
    pth = distutils_hack_files()[0].parent.parent / "distutils-precedence.pth"
    lines = [line for line in pth.read_text().splitlines() if line.startswith("import")]
    assert len(lines) == 1 and installer_pth_line(lines[0])


def test_a_genuine_editable_finder_proves() -> None:
    assert proven_installer_file(FINDER_PATH, genuine_finder()), STALE


_PATHS = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
_NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}(\.[A-Za-z_][A-Za-z0-9_]{0,8}){0,2}", fullmatch=True)


@settings(max_examples=60, deadline=None)
@given(mapping=st.dictionaries(_NAMES, _PATHS, max_size=4),
       namespaces=st.dictionaries(_NAMES, st.lists(_PATHS, max_size=2), max_size=3))  # fmt: skip
def test_any_tables_setuptools_writes_prove(mapping: dict[str, str], namespaces: dict[str, list[str]]) -> None:
    """Quotes, newlines and any other characters in the paths stay inside the literals setuptools writes."""
    content = genuine_finder(mapping, namespaces)
    assert normal_finder(content) == normal_finder(genuine_finder())
    assert proven_installer_file(FINDER_PATH, content), STALE


@pytest.mark.parametrize("package", ["demo_ns", "demo_ns.inner", "a.b.c"])
def test_setuptools_namespace_lines_are_installer_lines(package: str) -> None:
    assert installer_pth_line(genuine_nspkg_line(package))


@pytest.mark.parametrize("line", [
    "import __editable___demo_pkg_0_1_finder; __editable___demo_pkg_0_1_finder.install()",
    "import _virtualenv",
])  # fmt: skip
def test_editable_and_virtualenv_lines_are_installer_lines(line: str) -> None:
    assert installer_pth_line(line)


# --- disguises fail -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["_virtualenv.py", "_distutils_hack/__init__.py"])
def test_a_genuine_hook_with_one_line_appended_fails(name: str) -> None:
    genuine = distutils_hack_files()[0].read_bytes()
    path = f"/usr/lib/python3/site-packages/{name}"
    assert proven_installer_file(path, genuine), STALE
    assert not proven_installer_file(path, genuine + PAYLOAD.encode() + b"\n")
    assert not proven_installer_file(path, genuine.replace(b"\n", b"\n" + PAYLOAD.encode() + b"\n", 1))


def test_a_hook_named_like_the_installers_proves_nothing_by_its_name() -> None:
    assert not proven_installer_file("/usr/lib/python3/site-packages/_virtualenv.py", f"{PAYLOAD}\n".encode())
    assert not proven_installer_file("/usr/lib/python3/site-packages/_virtualenv.py", None)


def test_a_genuine_file_too_large_or_at_no_installer_path_fails() -> None:
    genuine = distutils_hack_files()[0].read_bytes()
    assert not proven_installer_file("/usr/lib/python3/site-packages/sitecustomize.py", genuine)
    assert not proven_installer_file("/usr/lib/python3/site-packages/_virtualenv.py",
                                     genuine + b"#" * MAX_PROVEN_BYTES)  # fmt: skip


@pytest.mark.parametrize("table, value", [
    ("MAPPING", "{} if __import__('os')._exit(0) else {}"),
    ("MAPPING", f"{{'demo_pkg': {PAYLOAD}}}"),
    ("MAPPING", "{'demo_pkg': '/src'}; " + PAYLOAD),
    ("NAMESPACES", "dict(demo_ns=[])"),
    ("NAMESPACES", "['demo_ns']"),
    ("PATH_PLACEHOLDER", f"str({PAYLOAD}) + \".__path_hook__\""),
])  # fmt: skip
def test_a_finder_whose_table_runs_code_or_changes_kind_fails(table: str, value: str) -> None:
    disguised = replace_table(genuine_finder(), table, value)
    assert disguised != genuine_finder()
    assert normal_finder(disguised) is None
    assert not proven_installer_file(FINDER_PATH, disguised)


def test_a_finder_with_an_extra_statement_fails() -> None:
    genuine = genuine_finder()
    lines = genuine.decode().split("\n")
    middle = next(index for index, line in enumerate(lines) if line.startswith("PATH_PLACEHOLDER")) + 1
    for disguised in (genuine + f"{PAYLOAD}\n".encode(),
                      "\n".join([*lines[:middle], PAYLOAD, *lines[middle:]]).encode(),
                      genuine.replace(b"MAPPING", f"{PAYLOAD}; MAPPING".encode(), 1)):  # fmt: skip
        assert not proven_installer_file(FINDER_PATH, disguised)


def test_a_finder_with_a_table_twice_fails() -> None:
    lines = genuine_finder().decode().split("\n")
    index = next(index for index, line in enumerate(lines) if line.startswith("MAPPING"))
    disguised = "\n".join([*lines[: index + 1], "MAPPING = {}", *lines[index + 1 :]]).encode()
    assert normal_finder(disguised) is None and not proven_installer_file(FINDER_PATH, disguised)


def test_an_nspkg_line_with_a_payload_after_a_semicolon_fails() -> None:
    genuine = genuine_nspkg_line("demo_ns.inner")
    assert not installer_pth_line(f"{genuine};{PAYLOAD}")
    assert not installer_pth_line(f"{genuine}; {PAYLOAD};")
    assert not installer_pth_line(f"{PAYLOAD};{genuine}")


@pytest.mark.parametrize("name", [
    "demo_ns', __import__('os').system('id'), '",
    "demo_ns')) or __import__('os').system('id') or (('",
    "demo_ns\\'",
    "demo_ns' + __import__('os').getcwd() + '",
])  # fmt: skip
def test_an_nspkg_line_whose_name_breaks_out_of_its_quotes_fails(name: str) -> None:
    genuine = genuine_nspkg_line("demo_ns")
    disguised = genuine.replace("setdefault('demo_ns'", f"setdefault('{name}'", 1)
    assert disguised != genuine
    assert not installer_pth_line(disguised)


@pytest.mark.parametrize("parts", [
    "('demo_ns', __import__('os').getcwd())",
    "('demo_ns',) + (__import__('os').getcwd(),)",
])  # fmt: skip
def test_an_nspkg_line_whose_path_parts_run_code_fails(parts: str) -> None:
    genuine = genuine_nspkg_line("demo_ns")
    disguised = genuine.replace("*('demo_ns',)", f"*{parts}", 1)
    assert disguised != genuine
    assert not installer_pth_line(disguised)


@pytest.mark.parametrize("line", [
    "import __editable___demo_pkg_0_1_finder; __editable___demo_pkg_0_1_finder.install(__import__('os'))",
    "import __editable___demo_pkg_0_1_finder; __editable___other_0_1_finder.install()",
    "import __editable___demo_pkg_0_1_finder; __editable___demo_pkg_0_1_finder.install(); " + PAYLOAD,
    "import __editable___demo_pkg_0_1_finder, os; __editable___demo_pkg_0_1_finder.install()",
    "import _virtualenv; " + PAYLOAD,
])  # fmt: skip
def test_an_editable_or_virtualenv_line_that_does_more_fails(line: str) -> None:
    assert not installer_pth_line(line)


def test_older_setuptools_lines_are_setuptools_and_a_develop_install_names_its_folder_as_a_plain_literal() -> None:
    """setuptools 49.3 to 49.6 and 60.1 wrote their distutils shim's line otherwise, and `setup.py develop` writes a
    namespace line whose root is the project's folder, quoted: still installers' lines, and still nothing but
    literals in their holes."""
    assert installer_pth_line("import os; enabled = os.environ.get('SETUPTOOLS_USE_DISTUTILS') == 'local'; enabled "
                              "and __import__('_distutils_hack').add_shim(); ")  # fmt: skip
    assert installer_pth_line("import os; var = 'SETUPTOOLS_USE_DISTUTILS'; enabled = os.environ.get(var, 'local') == "
                              "'local'; enabled and __import__('_distutils_hack').ensure_shim(); ")  # fmt: skip
    develop = ("import sys, types, os;p = os.path.join('/app/src', *('jaraco',));ie = os.path.exists(os.path.join(p,"
               "'__init__.py'));m = not ie and sys.modules.setdefault('jaraco', types.ModuleType('jaraco'));mp = (m or "
               "[]) and m.__dict__.setdefault('__path__',[]);(p not in mp) and mp.append(p)")  # fmt: skip
    assert installer_pth_line(develop)
    for root in ("'/app/src' + __import__('os').system('id') and ''", "'/a\\'b'", "__import__('os').getcwd()"):
        assert not installer_pth_line(develop.replace("'/app/src'", root)), root
