"""Where the verifier's runtime lives, and what a name can hide: pure rules over paths, for the watch's judge
(``tamper.py``). No I/O."""

from __future__ import annotations

import fnmatch
import posixpath
import re
import sys

from terminus_env.sandbox.inside.code_files import CODE_SUFFIXES as RUN_WHEN_OPENED
from terminus_env.sandbox.inside.code_files import LOADER_PRELOAD as LOADER_PRELOAD
from terminus_env.sandbox.inside.code_files import PATH_DIRS
from terminus_env.sandbox.inside.code_files import RUNNER_CONFIGS as RUNNER_CONFIGS
from terminus_env.sandbox.inside.code_files import STARTUP_MODULES as STARTUP_MODULES
from terminus_env.sandbox.inside.installer_files import installer_pth_line

DISTRIBUTION_PROGRAM_DIRS = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")
LOCAL_PROGRAM_DIRS = ("/usr/local/sbin", "/usr/local/bin")
DISTRIBUTION_LIB_DIRS = ("/lib", "/lib32", "/lib64", "/libx32", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libx32")
LIB_SEARCH = ("/lib/*-linux-gnu*", "/usr/lib/*-linux-gnu*", "/lib", "/lib64", "/usr/lib", "/usr/lib64")
PYTHON_DIRS = (
    "/usr/lib/python3.*", "/usr/lib/python3.*/lib-dynload", "/usr/lib/python3/dist-packages",
    "/usr/local/lib/python3.*", "/usr/local/lib/python3.*/lib-dynload", "/usr/local/lib/python3.*/site-packages",
    "/usr/local/lib/python3.*/dist-packages",
)  # fmt: skip
"""Where an image keeps Python's standard library and packages: a module of the same name elsewhere hides these."""
RUNTIME_PROGRAM = re.compile(
    r"(python[\d.]*|pip[\d.]*|pytest(-3)?|py\.test|uvx?|bash|sh|dash|env|node|perl[\d.]*|ruby)"
)
"""Interpreters, shells and test runners: in /usr/local, only programs of these names are the verifier's runtime."""
RUNNER_PACKAGES = frozenset(
    {"pytest", "_pytest", "pluggy", "py", "iniconfig", "packaging", "tomli", "exceptiongroup", "pygments"}
)
STANDARD_MODULES = frozenset(getattr(sys, "stdlib_module_names", ())) | {"sitecustomize", "usercustomize"}
CODE_SUFFIXES = (*RUN_WHEN_OPENED, ".pth")
"""Files the rules judge as code: those that run when opened, and ``.pth`` files (their import lines run)."""
PYTHON_ROOT = re.compile(r".*/lib/python3(\.\d+)?(/lib-dynload|/site-packages|/dist-packages)?")
STANDARD_LIBRARY = re.compile(r".*/lib/python3\.\d+/")
SITE = re.compile(r".*/(site|dist)-packages/")
SYSTEM_SITE = re.compile(r"(/usr(/local)?/lib/python3[.\d]*/(site|dist)-packages|/root/\.local/lib/python3[.\d]*/"
                         r"site-packages)/")
LIBRARY = re.compile(r"(lib[^/]*\.so(\.[\d.]+)?|ld-linux[^/]*\.so[\d.]*)")
MODULE_FILE = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(\.[A-Za-z0-9_-]+)?\.(py|pyc|pyo|so|pyd)")
PTH_EXECUTES = re.compile(rb"^import[ \t]", re.MULTILINE)
DEFAULT_ZIP = re.compile(r".*/lib/python3\d+\.zip")
"""The zip Python puts on its path before the standard library (``sys.path[0]`` of a fresh interpreter)."""
ZIP_MAGIC = b"PK\x03\x04"
"""A zip archive: Python imports modules from one on its path (``/usr/lib/python311.zip`` comes before the standard
library), and a ``.pth`` line can put one there."""



def is_runtime(path: str) -> bool:
    """A file the verifier's runtime is made of, rather than the task's own files (see the module's docstring). A
    site folder counts only where the system's interpreters keep theirs: a venv of the agent's is the agent's
    program, and one the verifier builds is its own."""
    folder, name = posixpath.split(path)
    site = SITE.match(path)
    if site and not SYSTEM_SITE.match(path):
        return False
    if site:
        top = path[site.end() :].split("/")[0]
        return module_name(top) in RUNNER_PACKAGES or top.startswith("pytest_")
    if STANDARD_LIBRARY.match(path):
        return True
    if folder in DISTRIBUTION_PROGRAM_DIRS:
        return True
    if folder in LOCAL_PROGRAM_DIRS:
        return bool(RUNTIME_PROGRAM.fullmatch(name))
    if any(path.startswith(root + "/") for root in DISTRIBUTION_LIB_DIRS):
        return True
    return folder == "/usr/local/lib" and name.startswith("libpython")


def pth_runs_code(head: bytes) -> bool:
    """A .pth line starting with ``import`` is run at start-up, unless it is one of Python's installers' lines in
    full (``installer_pth_line``: nothing but quoted names in its holes)."""
    return any(PTH_EXECUTES.match(line) and not installer_pth_line(line) for line in head.splitlines())


def program_patterns(path: str) -> list[str]:
    """The same program name in the PATH folders searched after this one."""
    folder, name = posixpath.split(path)
    later = PATH_DIRS[PATH_DIRS.index(folder) + 1 :] if folder in PATH_DIRS else ()
    return [f"{other}/{glob_escape(name)}" for other in later]


def library_patterns(path: str) -> list[str]:
    name = glob_escape(posixpath.basename(path))
    return [f"{folder}/{name}" for folder in LIB_SEARCH if not fnmatch.fnmatch(posixpath.dirname(path), folder)]


def module_patterns(path: str, workdir: str | None) -> list[str]:
    """The standard or runner module this file provides, wherever else the image keeps one."""
    root = python_root(path, workdir)
    if root is None:
        return []
    top = path[len(root) :].lstrip("/").split("/")[0]
    module = module_name(top)
    if module is None or not (module in STANDARD_MODULES or module in RUNNER_PACKAGES):
        return []
    forms = (f"{module}.py", f"{module}/__init__.py", f"{module}.*.so", f"{module}.so", f"{module}.pyc")
    return [f"{folder}/{form}" for folder in PYTHON_DIRS if not fnmatch.fnmatch(root, folder) for form in forms]


def found_by_import(path: str, workdir: str | None) -> bool:
    """Whether Python could import ``path`` as a module or a package by its name: below a folder on its search path
    (a site or standard folder, a venv's, the working folder) through folders that are package names."""
    prefix = PYTHON_ROOT.match(path)
    root = prefix.group(0) if prefix else (workdir or "/")
    if not prefix and not path.startswith(root.rstrip("/") + "/"):
        return False
    parts = path[len(root) :].strip("/").split("/")
    return all(part.isidentifier() for part in parts[:-1]) and module_name(parts[-1]) is not None


def imported_module(path: str, workdir: str | None) -> bool:
    """Whether ``path`` is a module file Python would import by its name from the search folder ``python_root``
    gives: a module file (``.py``, ``.pyc``, an extension), below that folder through package folders only. Data
    (``/app/site/index.html``, ``/app/venv/pyvenv.cfg``, ``/app/cmd/tool/main.go``) is never a module."""
    root = python_root(path, workdir)
    if root is None or not MODULE_FILE.fullmatch(posixpath.basename(path)):
        return False
    folders = path[len(root) :].strip("/").split("/")[:-1]
    return all(folder.isidentifier() for folder in folders)


def python_root(path: str, workdir: str | None) -> str | None:
    """The folder on Python's search path this file would be imported from, if it is one we can tell."""
    folder = posixpath.dirname(path)
    match = PYTHON_ROOT.match(folder)
    if match:
        return match.group(0)
    for root in (workdir, "/"):
        if root and (folder == root or folder.startswith(root.rstrip("/") + "/")):
            return root
    return None


def module_name(entry: str) -> str | None:
    """The module a folder entry provides: ``x.py``, ``x.cpython-311-x86_64-linux-gnu.so`` or package ``x``."""
    match = MODULE_FILE.fullmatch(entry)
    if match:
        return match.group("name")
    return entry if entry.isidentifier() else None


def glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)
