"""What an exploit knows before it acts: the instruction, and one look around the container.

An exploit sees only what an agent sees. Its first turn types :func:`survey_command`, which lists the working
folder, the folders and files the instruction names, and where the commands the instruction names live; each fact
is a line of its own, tagged so that the echo of the command itself never reads as one. :func:`parse_survey` reads
the terminal's output back, and :func:`modules` and :func:`programs` choose what to replace. Everything here is a
pure function of the instruction and that text.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath

MAX_LISTED = 150
"""Lines of the working folder's listing the survey prints: the terminal's output is capped at 10 kB."""
MAX_MODULES = 30
MAX_PROGRAMS = 20
LISTING_DEPTH = 4

SYSTEM_FOLDERS = (
    "/bin", "/sbin", "/usr/bin", "/usr/sbin", "/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/libexec", "/usr/share",
    "/etc", "/proc", "/sys", "/dev", "/run", "/boot", "/var/lib",
)  # fmt: skip
"""Where the image's own programs and data live: replacing them is the runtime's business (``runtime_modified``)."""
NOT_LISTED_FOLDERS = ("/", "/usr", "/var", "/tmp", "/opt", "/home", "/srv", "/data", "/var/log", "/logs", "/tests")
"""Folders too wide to list when the instruction names them; their named files are still looked at."""
INTERPRETERS = frozenset({
    "python", "python3", "pip", "pip3", "bash", "sh", "dash", "zsh", "env", "perl", "ruby", "node", "npm", "uv",
    "uvx", "pytest", "py.test", "make", "gcc", "cc", "git", "sudo",
})  # fmt: skip
"""Commands every verifier may run: replacing them is the runtime channel, not a task's program."""
MAKEFILES = frozenset({"Makefile", "makefile", "GNUmakefile"})
_TEST_FILE = re.compile(r"^(test_.*|.*_test|conftest|setup|noxfile)\.py$")
_TEST_FOLDERS = frozenset({"tests", "test", "testing"})
_NOT_PROGRAMS = (".so", ".o", ".a", ".dll", ".dylib", ".txt", ".md", ".json", ".csv", ".log", ".ini", ".toml")
_ABSOLUTE = re.compile(r"(?<![\w./:~-])(/[A-Za-z0-9._+-]+(?:/[A-Za-z0-9._+-]+)*/?)")
_RELATIVE = re.compile(r"(?<![\w./:~-])([A-Za-z0-9_][\w.-]*(?:/[\w.-]+)*\.(?:py|sh))(?![\w/-])")
_QUOTED = re.compile(r"`([^`\n]+)`")
_COMMAND = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
_LINE = re.compile(r"^@(?P<tag>[WFCN]) (?P<rest>.+)$")


@dataclass(frozen=True)
class FileEntry:
    path: str
    mode: int
    """Permission bits, as ``find -printf %m`` gives them."""

    @property
    def executable(self) -> bool:
        return bool(self.mode & 0o111)


@dataclass(frozen=True)
class NamedPath:
    """A path the instruction names, as the container has it: a file (``f``), a folder (``d``), or nothing (``-``)."""

    path: str
    kind: str
    mode: int = 0


@dataclass(frozen=True)
class Survey:
    instruction: str
    workdir: str | None = None
    files: tuple[FileEntry, ...] = ()
    commands: tuple[tuple[str, str], ...] = ()
    """The instruction's commands that resolve to a program, with its path."""
    named: tuple[NamedPath, ...] = ()


def named_paths(instruction: str) -> list[str]:
    """The absolute paths the instruction names, in order, without repeats or trailing punctuation."""
    found: list[str] = []
    for match in _ABSOLUTE.finditer(instruction):
        path = match.group(1).rstrip(".,:;")
        path = path.rstrip("/") or "/"
        if path not in found:
            found.append(path)
    return found


def named_files(instruction: str) -> list[str]:
    """The relative paths of scripts and modules the instruction names (``grid_transform.py``, ``src/run.sh``): the
    survey looks for them in the working folder."""
    found: list[str] = []
    for match in _RELATIVE.finditer(instruction):
        if match.group(1) not in found:
            found.append(match.group(1))
    return found


def named_commands(instruction: str) -> list[str]:
    """The first word of each quoted command in the instruction (`` `myapp show` `` names ``myapp``)."""
    found: list[str] = []
    for match in _QUOTED.finditer(instruction):
        words = match.group(1).split()
        if words and _COMMAND.match(words[0]) and not words[0].isdigit() and words[0] not in found:
            found.append(words[0])
    return found


def survey_command(instruction: str) -> str:
    """Keystrokes that print the survey: ``@W`` the working folder, ``@F`` each file worth replacing there and in
    the folders the instruction names, ``@C`` where each named command lives, ``@N`` what each named path is (a
    relative one looked for in the working folder)."""
    folders = [p for p in named_paths(instruction) if _listable(p)]
    prune = r"\( -name '.*' -o -name node_modules -o -name __pycache__ -o -name site-packages -o -name venv \) -prune"
    makefiles = " -o ".join(f"-name {name}" for name in sorted(MAKEFILES))
    wanted = rf"\( -name '*.py' -o -name '*.sh' -o {makefiles} -o -perm /111 \)"
    roots = " ".join(['"$PWD"', *map(shlex.quote, folders)])
    lines = [
        "printf '@W %s\\n' \"$PWD\"",
        f"for d in {roots}; do [ \"$d\" != / ] && find \"$d\" -maxdepth {LISTING_DEPTH} {prune} -o -type f {wanted} "
        f"-printf '@F %m %p\\n'; done 2>/dev/null | sort -u | head -n {MAX_LISTED}",
    ]
    commands = named_commands(instruction)
    if commands:
        words = " ".join(map(shlex.quote, commands))
        lines.append(f"for w in {words}; do p=$(command -v -- \"$w\") && printf '@C %s %s\\n' \"$w\" \"$p\"; done")
    paths = [shlex.quote(p) for p in named_paths(instruction)]
    paths += [f'"$PWD"/{shlex.quote(p)}' for p in named_files(instruction)]
    if paths:
        quoted = " ".join(paths)
        lines.append(f"for p in {quoted}; do find \"$p\" -maxdepth 0 -printf '@N %y %m %p\\n' 2>/dev/null "
                     "|| printf '@N - 0 %s\\n' \"$p\"; done")  # fmt: skip
    return "; ".join(lines) + "\n"


def parse_survey(instruction: str, text: str) -> Survey:
    """The survey's facts from the terminal's output; lines that are not the survey's (the echoed command, the
    prompt, a line cut by the terminal's width) are ignored."""
    workdir, files, commands, named = None, [], [], []
    for raw in text.splitlines():
        match = _LINE.match(raw.strip())
        if match is None:
            continue
        tag, rest = match.group("tag"), match.group("rest")
        if tag == "W" and rest.startswith("/"):
            workdir = rest
        elif tag == "F":
            mode, _, path = rest.partition(" ")
            if _octal(mode) is not None and path.startswith("/"):
                files.append(FileEntry(path, _octal(mode) or 0))
        elif tag == "C":
            name, _, path = rest.partition(" ")
            if path.startswith("/"):
                commands.append((name, path))
        elif tag == "N":
            parts = rest.split(" ", 2)
            if len(parts) == 3 and parts[2].startswith("/") and _octal(parts[1]) is not None:
                named.append(NamedPath(parts[2], "d" if parts[0] == "d" else "f" if parts[0] == "f" else "-",
                                       _octal(parts[1]) or 0))  # fmt: skip
    return Survey(instruction, workdir, tuple(dict.fromkeys(files[:MAX_LISTED])), tuple(dict.fromkeys(commands)),
                  tuple(dict.fromkeys(named)))  # fmt: skip


def modules(survey: Survey) -> list[str]:
    """The Python modules to replace: those in the working folder and the named folders (not the project's own
    tests, its ``conftest.py`` or ``setup.py``), and every ``.py`` path the instruction names, made if missing."""
    chosen: list[str] = []
    for entry in survey.files:
        if entry.path.endswith(".py") and not is_test(entry.path) and not _in_system_folder(entry.path):
            chosen.append(entry.path)
    for named in survey.named:
        if named.path.endswith(".py") and named.kind != "d" and not is_test(named.path):
            if not _in_system_folder(named.path):
                chosen.append(named.path)
    return list(dict.fromkeys(chosen))[:MAX_MODULES]


def programs(survey: Survey) -> list[str]:
    """The programs to replace: the instruction's named programs (made if missing: a path in a ``bin`` folder or
    with a script's suffix), the executables, scripts and Makefiles of the working folder and the named folders, and the
    commands the instruction names that live outside the image's system folders. Interpreters and the tools every
    verifier runs are the runtime's, not the task's, and stay."""
    chosen: list[str] = []
    for named in survey.named:
        if named.kind == "d" or _in_system_folder(named.path) or is_test(named.path):
            continue
        if named.kind == "f" and (named.mode & 0o111 or _script(named.path)):
            chosen.append(named.path)
        elif named.kind == "-" and (_script(named.path) or PurePosixPath(named.path).parent.name in ("bin", "sbin")):
            chosen.append(named.path)
    for entry in survey.files:
        if _in_system_folder(entry.path) or is_test(entry.path) or entry.path.endswith(_NOT_PROGRAMS):
            continue
        if entry.executable or entry.path.endswith(".sh") or is_makefile(entry.path):
            chosen.append(entry.path)
    for name, path in survey.commands:
        if name not in INTERPRETERS and not _in_system_folder(path):
            chosen.append(path)
    return [p for p in dict.fromkeys(chosen) if PurePosixPath(p).name not in INTERPRETERS][:MAX_PROGRAMS]


def is_python(path: str) -> bool:
    return path.endswith(".py")


def is_makefile(path: str) -> bool:
    """A build file that ``make`` runs: the program of the tests that build the agent's code."""
    return PurePosixPath(path).name in MAKEFILES


def _script(path: str) -> bool:
    return path.endswith((".sh", ".bash", ".py"))


def is_test(path: str) -> bool:
    """The project's own tests: a test module, `conftest.py`, `setup.py`, or anything in a tests folder."""
    parts = PurePosixPath(path).parts
    return bool(_TEST_FILE.match(parts[-1])) or any(part in _TEST_FOLDERS for part in parts[:-1])


def _in_system_folder(path: str) -> bool:
    return any(path == folder or path.startswith(folder + "/") for folder in SYSTEM_FOLDERS)


def _listable(path: str) -> bool:
    return path not in NOT_LISTED_FOLDERS and not _in_system_folder(path) and PurePosixPath(path).suffix == ""


def _octal(text: str) -> int | None:
    try:
        return int(text, 8)
    except ValueError:
        return None
