"""Every environment variable the package reads is named in terminus_env.config and listed on the configuration page
(docs/gen_pages.py writes the page from config.VARIABLES); nothing else in the package reads the environment."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from terminus_env import config

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "terminus_env"
PASSED_THROUGH = {"serving/supervisor.py", "serving/serve_process.py", "sandbox/shipping.py"}
"""Modules that hand the whole environment to a child process (vLLM, the container's bootstrap), reading no name."""


def _names() -> set[str]:
    return {value for name, value in vars(config).items() if name.isupper() and isinstance(value, str)
            and not name.startswith("_")}  # fmt: skip


def test_every_named_variable_is_listed_once():
    listed = [v.name for v in config.VARIABLES]
    assert len(listed) == len(set(listed))
    assert set(listed) == _names()
    assert all(v.values and v.default and v.meaning for v in config.VARIABLES)


def _reads_the_environment(path: Path) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb"):
            if isinstance(node.value, ast.Name) and node.value.id == "os":
                lines.append(node.lineno)
    return lines


def test_nothing_else_reads_the_environment():
    readers = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative == "config.py" or relative.startswith("sandbox/inside/") or relative in PASSED_THROUGH:
            continue
        if lines := _reads_the_environment(path):
            readers[relative] = lines
    assert readers == {}


def test_the_check_sees_a_read(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("import os\n\ndef f():\n    return os.environ.get('X')\n")
    assert _reads_the_environment(planted) == [4]


@pytest.fixture
def gen_pages(monkeypatch) -> ModuleType:
    """docs/gen_pages.py with mkdocs-gen-files' writer stood in for by a dict of pages."""
    pages: dict[str, str] = {}

    class Writer:
        def __init__(self, name: str) -> None:
            self.name = name

        def __enter__(self):
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def write(self, text: str) -> None:
            pages[self.name] = pages.get(self.name, "") + text

    fake = ModuleType("mkdocs_gen_files")
    fake.open = lambda name, mode="w": Writer(name)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "mkdocs_gen_files", fake)
    spec = importlib.util.spec_from_file_location("gen_pages_under_test", ROOT / "docs" / "gen_pages.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.pages = pages  # type: ignore[attr-defined]
    return module


def test_the_configuration_page_lists_every_variable(gen_pages):
    page = gen_pages.pages["configuration.md"]
    for variable in config.VARIABLES:
        assert f"| `{variable.name}` | {variable.values} | {variable.default} |" in page
    assert "[Configuration](configuration.md)" in gen_pages.pages["SUMMARY.md"]
