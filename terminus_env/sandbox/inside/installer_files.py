"""Files Python's installers write that Python runs at every start, proved by their content, never by their name.

An installer's ``.pth`` line runs at every start of Python and imports a module of the installer's: uv's and
virtualenv's ``_virtualenv``, setuptools' ``_distutils_hack`` and an editable install's ``__editable___*_finder``.
The agent can write files of those names too, so a name proves nothing. A file counts as the installer's only when
its content is one an installer writes: a hash of the released files (``INSTALLER_HASHES``, made by
``scripts/installer-hashes.py`` from the installers' releases), and for an editable finder, setuptools' template with
its three literal tables (which modules live where) taken out, each checked to be a plain literal first. A ``.pth``
line counts as an installer's only when it is one of the installers' lines in full, with nothing but quoted names and
paths in its holes (``installer_pth_line``).
"""

import ast
import hashlib
import os
import re

from .installer_hashes import INSTALLER_HASHES

_NAME = r"'[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*'"
_PART = r"'[A-Za-z_][A-Za-z0-9_]*'"
_PARTS = r"\(" + _PART + r",\)|\(" + _PART + r"(?:, " + _PART + r")+\)"
"""A tuple's repr: ``('a',)`` or ``('a', 'b')``."""
_ROOT = r"(?:sys\._getframe\(1\)\.f_locals\['sitedir'\]|'[^'\\\n]*')"  # the site folder, or a develop install's path
_NSPKG_STATEMENTS = tuple(re.compile(pattern) for pattern in (
    r"import sys, types, os",
    r"has_mfs = sys\.version_info > \(3, 5\)",
    r"p = os\.path\.join\(" + _ROOT + r", \*(?:" + _PARTS + r")\)",
    r"importlib = has_mfs and __import__\('importlib\.util'\)",
    r"has_mfs and __import__\('importlib\.machinery'\)",
    r"m = has_mfs and sys\.modules\.setdefault\(" + _NAME + r", importlib\.util\.module_from_spec\(importlib\.machinery"
    r"\.PathFinder\.find_spec\(" + _NAME + r", \[os\.path\.dirname\(p\)\]\)\)\)",
    r"ie = os\.path\.exists\(os\.path\.join\(p,'__init__\.py'\)\)",
    r"m = not ie and sys\.modules\.setdefault\(" + _NAME + r", types\.ModuleType\(" + _NAME + r"\)\)",
    r"m = m or sys\.modules\.setdefault\(" + _NAME + r", types\.ModuleType\(" + _NAME + r"\)\)",
    r"mp = \(m or \[\]\) and m\.__dict__\.setdefault\('__path__',\[\]\)",
    r"\(p not in mp\) and mp\.append\(p\)",
    r"m and setattr\(sys\.modules\[" + _NAME + r"\], " + _NAME + r", m\)",
))  # fmt: skip
"""setuptools' namespace-package lines (``*-nspkg.pth``), statement by statement: the holes take quoted names only.
The line makes empty module objects for the namespace's folders and runs nothing else (``find_spec`` and
``module_from_spec`` find and create a module without running it)."""
_OTHER_LINES = (
    re.compile(r"import (__editable___[A-Za-z0-9_.]+_finder); \1\.install\(\)"),
    re.compile(r"import os; var = 'SETUPTOOLS_USE_DISTUTILS'; enabled = os\.environ\.get\(var, '(?:local|stdlib)'\) == "
               r"'local'; enabled and __import__\('_distutils_hack'\)\.(?:add|ensure)_shim\(\); ?"),
    re.compile(r"import os; enabled = os\.environ\.get\('SETUPTOOLS_USE_DISTUTILS'\) == 'local'; enabled and "
               r"__import__\('_distutils_hack'\)\.add_shim\(\); ?"),  # setuptools 49.3 to 49.6
    re.compile(r"import _virtualenv"),
)  # fmt: skip
"""An editable install's finder, setuptools' distutils shim and the virtualenv hook: each imports a module whose
content is proved on its own (``proven_installer_file``)."""
_FINDER = re.compile(r"__editable___[A-Za-z0-9_.]+_finder\.py")
_FINDER_TABLES = (
    (re.compile(r"MAPPING(?:: [^=]+)? = (.+)"), dict),
    (re.compile(r"NAMESPACES(?:: [^=]+)? = (.+)"), dict),
    (re.compile(r"PATH_PLACEHOLDER(?:: [^=]+)? = (.+) \+ \"\.__path_hook__\""), str),
)
MAX_PROVEN_BYTES = 65536


def installer_pth_line(line):
    """Whether a ``.pth`` line that Python runs (it starts with ``import``) is an installer's line in full."""
    text = line.strip().decode("utf-8", "replace") if isinstance(line, bytes) else line.strip()
    if any(pattern.fullmatch(text) for pattern in _OTHER_LINES):
        return True
    statements = text.split(";")
    if statements[-1].strip() == "":
        statements.pop()
    return (len(statements) > 1 and statements[0] == "import sys, types, os"
            and all(any(pattern.fullmatch(part) for pattern in _NSPKG_STATEMENTS) for part in statements))  # fmt: skip


def installer_hook_candidate(path):
    """Whether ``path`` is named like a module an installer's line imports: its content is then worth proving."""
    name = os.path.basename(path)
    return (name == "_virtualenv.py" or "/_distutils_hack/" in path and name.endswith(".py")
            or bool(_FINDER.fullmatch(name)))  # fmt: skip


def proven_installer_file(path, content):
    """Whether ``content`` (the whole file) is what an installer writes at ``path``'s kind of place."""
    if content is None or len(content) > MAX_PROVEN_BYTES:
        return False
    name = os.path.basename(path)
    if _FINDER.fullmatch(name):
        normal = normal_finder(content)
        return normal is not None and _digest(normal) in INSTALLER_HASHES
    return installer_hook_candidate(path) and _digest(content) in INSTALLER_HASHES


def normal_finder(content):
    """An editable finder with its three tables replaced by their names, or None unless each table is a plain
    literal of its kind on one line (nothing that runs)."""
    try:
        lines = content.decode("utf-8").split("\n")
    except UnicodeDecodeError:
        return None
    found = 0
    for index, line in enumerate(lines):
        for pattern, kind in _FINDER_TABLES:
            match = pattern.fullmatch(line)
            if match is None:
                continue
            try:
                value = ast.literal_eval(match.group(1))
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                return None
            if not isinstance(value, kind):
                return None
            lines[index] = line[: match.start(1)] + "<" + kind.__name__ + ">" + line[match.end(1):]
            found += 1
            break
    return "\n".join(lines).encode() if found == len(_FINDER_TABLES) else None


def _digest(data):
    return hashlib.sha256(data).hexdigest()
