"""Write terminus_env/sandbox/inside/installer_hashes.py from the installers' releases on PyPI.

The sandbox accepts a file that a ``.pth`` line imports only when its content is one an installer writes
(installer_files.py). This script makes those contents the way the installers do and hashes them:

- uv: each sampled release's ``uv venv`` (the binary from its wheel) makes a venv; its ``_virtualenv.py`` is hashed.
  The sample is the first and last release of every minor series plus 0.9.5, then bisection between neighbours
  whose files differ, so each range in the output's comments ends exactly where the file changed (``--uv all``
  runs every release instead).
- virtualenv: every release from 20.0.0: the ``_virtualenv.py`` it writes into a venv. Releases that fill the scripts
  path into their copy also have the packaged file hashed (it lies in the installed package). The newest release, and
  the first and last that fill it in, each make one real venv to confirm the copy.
- setuptools: every release from 49.0 that ships ``_distutils_hack``: its ``.py`` files, and a check that its
  ``distutils-precedence.pth`` line is one ``installer_pth_line`` accepts. From 64.0 on, a fresh venv with that
  release ``pip install --no-build-isolation -e``'s two small projects (a flat one, and a src-layout one with a
  namespace package); the finders they get are hashed after ``normal_finder`` and their ``.pth`` lines checked.

Run it with the worktree's Python (``.venv/bin/python scripts/installer-hashes.py``). It needs pip's access to PyPI,
a Python 3.10 or 3.11 for the editable installs (setuptools' newest releases need 3.10, its oldest fail on 3.12) and a
Python below 3.10 (uv and virtualenv no longer write ``_virtualenv.py`` for 3.10 and later). Downloads go to a
temporary folder, one wheel at a time per worker, each deleted after use; the folder is removed at the end. When a
release cannot be processed (a download or an install fails), the file is left as it was and the exit status is 1.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import errno
import glob
import hashlib
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import zipfile
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from terminus_env.sandbox.inside.installer_files import installer_pth_line, normal_finder

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "terminus_env" / "sandbox" / "inside" / "installer_hashes.py"
UV_FIRST = Version("0.1.0")
UV_ALWAYS = (Version("0.9.5"),)
VIRTUALENV_FIRST = Version("20.0.0")
SETUPTOOLS_FIRST = Version("49.0")
EDITABLE_FIRST = Version("64.0")
BDIST_WHEEL_IN_SETUPTOOLS = Version("70.1")
WHEEL_FOR_OLD_SETUPTOOLS = "0.45.1"
"""The last ``wheel`` release with its own ``bdist_wheel``, which setuptools before 70.1 builds editable wheels with."""
VIRTUALENV_MEMBER = "virtualenv/create/via_global_ref/_virtualenv.py"
VIRTUALENV_COPIED = "_virtualenv.py"
VIRTUALENV_PACKAGED = "_virtualenv.py as packaged, its scripts path not yet filled in"
SCRIPT_DIR_HOLE = '"__SCRIPT_DIR__"'
POSIX_SCRIPT_DIR = "../../../bin"
"""What virtualenv puts in ``SCRIPT_DIR_HOLE``: bin/ relative to lib/pythonX.Y/site-packages (CPython, POSIX)."""
DOWNLOAD_TIMEOUT_S = 600
INSTALL_TIMEOUT_S = 900
TOOL_TIMEOUT_S = 300
EXEC_ATTEMPTS = 5
COMMENT_WIDTH = 116

UV = "uv"
VIRTUALENV = "virtualenv"
SETUPTOOLS = "setuptools"

FLAT_PROJECT = {
    "pyproject.toml": """\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "ihflat"
version = "0.1"

[tool.setuptools]
packages = ["ihflat"]
py-modules = ["ihmod"]
""",
    "ihflat/__init__.py": "X = 1\n",
    "ihmod.py": "Y = 2\n",
}
"""A flat-layout package and a module: setuptools gives it a finder rather than a path line."""
NAMESPACE_PROJECT = {
    "pyproject.toml": """\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "ihns"
version = "0.1"

[tool.setuptools]
packages = ["ihns", "ihns.core", "ihns.extra"]

[tool.setuptools.package-dir]
"" = "src"
"ihns.extra" = "lib/extra"
""",
    "src/ihns/core/__init__.py": "A = 1\n",
    "lib/extra/__init__.py": "B = 2\n",
}
"""A src layout whose ``ihns`` is a namespace package (no ``__init__.py``) and one of whose packages lives elsewhere:
the finder's NAMESPACES is not empty, and the odd mapping keeps setuptools from writing a plain path line."""
NAMESPACE_FINDER = "__editable___ihns_0_1_finder.py"


@dataclass(frozen=True)
class Found:
    """One installer file: its digest, which release wrote it and what it is."""

    digest: str
    tool: str
    version: Version
    kind: str


@dataclass(frozen=True)
class Problem:
    """A release that could not be processed in full, or wrote something the sandbox's rules reject."""

    tool: str
    version: Version
    reason: str


@dataclass
class Outcome:
    """What processing one release gave."""

    found: list[Found] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    skipped: str = ""
    """Why the release has nothing to hash (e.g. a setuptools before ``_distutils_hack``); empty when it has."""
    failed: bool = False
    """The release could not be processed (its problem says why): what it writes is unknown."""

    def key(self) -> tuple[str, ...]:
        """The release's files as one comparable value (bisection compares neighbours by it)."""
        return tuple(sorted(f"{found.kind}:{found.digest}" for found in self.found)) + tuple(
            problem.reason for problem in self.problems
        )


@dataclass(frozen=True)
class Pythons:
    """The interpreters the script runs installers with."""

    editable: str
    """3.10 or 3.11: makes the venvs setuptools' editable installs go into."""
    legacy: str
    """Below 3.10: the interpreter uv and virtualenv still write ``_virtualenv.py`` for."""


@dataclass(frozen=True)
class Confirmation:
    """Whether a real venv made by a virtualenv release holds the ``_virtualenv.py`` hashed for it."""

    version: Version
    confirmed: bool
    text: str


class StepFailed(Exception):
    """A command the script ran failed; the message says which and its output's tail."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--uv", choices=("sample", "all"), default="sample", help="which uv releases to run")
    parser.add_argument("--jobs", type=int, default=3, help="releases processed at once")
    parser.add_argument("--python", default=sys.executable, help="a Python 3.10 or 3.11 for the editable installs")
    parser.add_argument("--legacy-python", default=None, help="a Python 3.7-3.9 (default: found on PATH or pyenv)")
    parser.add_argument("--output", type=Path, default=OUTPUT, help="the file to write")
    args = parser.parse_args(argv)
    started = time.monotonic()
    pythons = Pythons(editable=checked_python(args.python, (3, 10), (3, 12), "--python"),
                      legacy=checked_python(args.legacy_python or find_legacy_python(), (3, 7), (3, 10),
                                            "--legacy-python"))  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="installer-hashes-") as work_dir:
        work = Path(work_dir)
        runner = Runner(work, args.jobs)
        outcomes: dict[str, dict[Version, Outcome]] = {}
        uv_releases = [version for version in release_versions(UV) if version >= UV_FIRST]
        outcomes[UV] = run_uv(runner, uv_releases, args.uv, pythons)
        virtualenv_releases = [version for version in release_versions(VIRTUALENV) if version >= VIRTUALENV_FIRST]
        outcomes[VIRTUALENV] = runner.each(virtualenv_releases, virtualenv_outcome, VIRTUALENV)
        confirmations = confirm_virtualenv_copies(work, outcomes[VIRTUALENV], pythons)
        setuptools_releases = [version for version in release_versions(SETUPTOOLS) if version >= SETUPTOOLS_FIRST]
        wheel_wheel = download("wheel", WHEEL_FOR_OLD_SETUPTOOLS, work / "wheel-package")
        outcomes[SETUPTOOLS] = runner.each(
            setuptools_releases,
            lambda version, folder: setuptools_outcome(version, folder, wheel_wheel, pythons),
            SETUPTOOLS,
        )
    found = [item for per_tool in outcomes.values() for outcome in per_tool.values() for item in outcome.found]
    newest = {tool: max(per_tool) for tool, per_tool in outcomes.items() if per_tool}
    failed = (any(outcome.failed for per_tool in outcomes.values() for outcome in per_tool.values())
              or not all(confirmation.confirmed for confirmation in confirmations))  # fmt: skip
    if not failed:
        args.output.write_text(hashes_module(found, newest))
    print_summary(outcomes, found, confirmations, None if failed else args.output, time.monotonic() - started)
    return 1 if failed else 0


# --- releases and downloads -----------------------------------------------------------------------------------------


def release_versions(package: str) -> list[Version]:
    """The package's final releases on the index pip uses, oldest first."""
    output = run([sys.executable, "-m", "pip", "index", "versions", package], timeout=DOWNLOAD_TIMEOUT_S)
    for line in output.splitlines():
        if line.startswith("Available versions:"):
            versions = []
            for text in line.split(":", 1)[1].split(","):
                try:
                    versions.append(Version(text.strip()))
                except InvalidVersion:
                    continue
            return sorted(version for version in versions if not version.is_prerelease)
    raise StepFailed(f"pip index versions {package} listed no versions; is PyPI reachable through pip?")


def download(package: str, version: Version | str, folder: Path) -> Path:
    """The wheel of one release, downloaded into ``folder`` (pip's own cache left out)."""
    folder.mkdir(parents=True, exist_ok=True)
    run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-cache-dir", "--only-binary=:all:",
         "-d", str(folder), f"{package}=={version}"], timeout=DOWNLOAD_TIMEOUT_S)  # fmt: skip
    wheels = sorted(folder.glob("*.whl"))
    if len(wheels) != 1:
        raise StepFailed(f"pip download {package}=={version} left {len(wheels)} wheels in {folder}")
    return wheels[0]


class Runner:
    """Runs one function per release on a few threads, each release in a folder of its own that is removed after."""

    def __init__(self, work: Path, jobs: int) -> None:
        self.work = work
        self.jobs = max(1, jobs)
        self._lock = threading.Lock()

    def each(self, versions: Iterable[Version], process: Callable[[Version, Path], Outcome], tool: str,
             ) -> dict[Version, Outcome]:  # fmt: skip
        versions = list(versions)
        with concurrent.futures.ThreadPoolExecutor(self.jobs) as pool:
            outcomes = pool.map(lambda version: self._one(version, process, tool), versions)
            return dict(zip(versions, outcomes))

    def _one(self, version: Version, process: Callable[[Version, Path], Outcome], tool: str) -> Outcome:
        folder = Path(tempfile.mkdtemp(prefix=f"{tool}-{version}-", dir=self.work))
        try:
            outcome = process(version, folder)
        except Exception as error:  # one release that fails must not sink the others
            outcome = Outcome(problems=[Problem(tool, version, f"{type(error).__name__}: {error}")], failed=True)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        with self._lock:
            files = ", ".join(f"{found.kind} {found.digest[:12]}" for found in outcome.found)
            notes = "; ".join(problem.reason.splitlines()[0][:200] for problem in outcome.problems)
            print(f"{tool} {version}: {files or outcome.skipped or '-'}{'  PROBLEM: ' + notes if notes else ''}",
                  file=sys.stderr, flush=True)  # fmt: skip
        return outcome


# --- uv ------------------------------------------------------------------------------------------------------------


def run_uv(runner: Runner, releases: list[Version], mode: str, pythons: Pythons) -> dict[Version, Outcome]:
    """uv's releases: every one, or a sample refined by bisection wherever two neighbours' files differ."""

    def process(version: Version, folder: Path) -> Outcome:
        return uv_outcome(version, folder, pythons.legacy)

    if mode == "all":
        return runner.each(releases, process, UV)
    series: dict[tuple[int, int], list[Version]] = defaultdict(list)
    for version in releases:
        series[version.release[:2]].append(version)
    sample = {version for members in series.values() for version in (members[0], members[-1])}
    sample.update(version for version in UV_ALWAYS if version in releases)
    outcomes = runner.each(sorted(sample), process, UV)
    while True:
        done = sorted(outcomes)
        middles = []
        for low, high in zip(done, done[1:]):
            low_index, high_index = releases.index(low), releases.index(high)
            if high_index - low_index > 1 and outcomes[low].key() != outcomes[high].key():
                middles.append(releases[(low_index + high_index) // 2])
        if not middles:
            return outcomes
        outcomes.update(runner.each(middles, process, UV))


def uv_outcome(version: Version, folder: Path, python: str) -> Outcome:
    """Make a venv with this uv release's binary and hash the ``_virtualenv.py`` it writes."""
    wheel = download(UV, version, folder / "download")
    with zipfile.ZipFile(wheel) as archive:
        members = [name for name in archive.namelist() if re.fullmatch(r"[^/]+\.data/scripts/uv", name)]
        if len(members) != 1:
            raise StepFailed(f"{wheel.name} holds no single .data/scripts/uv")
        binary = folder / "uv"
        binary.write_bytes(archive.read(members[0]))
    wheel.unlink()
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    home = folder / "home"
    home.mkdir()
    # uv's first releases take only true or false in their switches' variables.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "XDG_CONFIG_HOME": str(home),
           "UV_OFFLINE": "true", "UV_NO_CACHE": "true", "UV_CACHE_DIR": str(folder / "cache"),
           "UV_PYTHON_DOWNLOADS": "never", "UV_NO_CONFIG": "true"}  # fmt: skip
    command = [str(binary), "venv", "--python", python, str(folder / "venv")]
    for attempt in range(EXEC_ATTEMPTS):
        try:
            run(command, cwd=home, env=env, timeout=TOOL_TIMEOUT_S)
            break
        except OSError as error:
            # A process another worker forks while this one writes the binary holds it open for writing until that
            # process runs its own program; until then the kernel refuses to run the binary.
            if error.errno != errno.ETXTBSY or attempt == EXEC_ATTEMPTS - 1:
                raise
            time.sleep(0.2 * (attempt + 1))
    outcome = Outcome()
    site = site_packages(folder / "venv")
    hook = site / "_virtualenv.py"
    if not hook.is_file():
        outcome.problems.append(Problem(UV, version, f"uv venv wrote no _virtualenv.py for {python}"))
    else:
        outcome.found.append(Found(digest(hook.read_bytes()), UV, version, "_virtualenv.py"))
    outcome.problems += pth_problems(UV, version, site.glob("*.pth"))
    return outcome


# --- virtualenv ----------------------------------------------------------------------------------------------------


def virtualenv_outcome(version: Version, folder: Path) -> Outcome:
    """Hash the ``_virtualenv.py`` in this virtualenv release's wheel, as packaged and as copied into a venv."""
    wheel = download(VIRTUALENV, version, folder / "download")
    with zipfile.ZipFile(wheel) as archive:
        if VIRTUALENV_MEMBER not in archive.namelist():
            return Outcome(skipped=f"no {VIRTUALENV_MEMBER}")
        packaged = archive.read(VIRTUALENV_MEMBER)
        filled = any(b"__SCRIPT_DIR__" in archive.read(name) for name in archive.namelist()
                     if name.endswith(".py") and name != VIRTUALENV_MEMBER)  # fmt: skip
    outcome = Outcome()
    copied = virtualenv_copy(packaged)
    outcome.found.append(Found(digest(copied), VIRTUALENV, version, VIRTUALENV_COPIED))
    if copied != packaged:
        outcome.found.append(Found(digest(packaged), VIRTUALENV, version, VIRTUALENV_PACKAGED))
        if not filled:
            outcome.problems.append(Problem(VIRTUALENV, version, "_virtualenv.py has the scripts-path hole but no "
                                            "code of the release fills it"))  # fmt: skip
    return outcome


def virtualenv_copy(packaged: bytes) -> bytes:
    """The ``_virtualenv.py`` virtualenv writes into a POSIX CPython venv (older releases fill in the scripts path)."""
    return packaged.replace(SCRIPT_DIR_HOLE.encode(), repr(POSIX_SCRIPT_DIR).encode())


def confirm_virtualenv_copies(work: Path, outcomes: dict[Version, Outcome], pythons: Pythons) -> list[Confirmation]:
    """Make a real venv with the newest virtualenv, and with the first and last that fill in the scripts path, and
    compare the ``_virtualenv.py`` each writes with the one hashed."""
    with_file = sorted(version for version, outcome in outcomes.items() if outcome.found)
    filling = [version for version in with_file if VIRTUALENV_PACKAGED in _kinds(outcomes[version])]
    chosen = sorted({*with_file[-1:], *filling[:1], *filling[-1:]})
    lines = []
    for version in chosen:
        folder = Path(tempfile.mkdtemp(prefix=f"confirm-virtualenv-{version}-", dir=work))
        try:
            lines.append(confirm_virtualenv_copy(version, folder, outcomes[version], pythons))
        except (StepFailed, OSError) as error:
            lines.append(Confirmation(version, False, f"could not confirm: {str(error).splitlines()[0][:300]}"))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return lines


def confirm_virtualenv_copy(version: Version, folder: Path, outcome: Outcome, pythons: Pythons) -> Confirmation:
    tool = folder / "tool"
    run([pythons.legacy, "-m", "venv", str(tool)], timeout=INSTALL_TIMEOUT_S)  # its own pip: ours needs Python 3.10
    tool_python = str(tool / "bin" / "python")
    run([tool_python, "-m", "pip", "install", "-q", "--no-cache-dir", f"virtualenv=={version}"],
        timeout=INSTALL_TIMEOUT_S)
    env = dict(os.environ, VIRTUALENV_OVERRIDE_APP_DATA=str(folder / "app-data"))
    run([tool_python, "-m", "virtualenv", "--no-seed", "-p", pythons.legacy, str(folder / "venv")], env=env,
        timeout=TOOL_TIMEOUT_S)
    written = site_packages(folder / "venv") / "_virtualenv.py"
    if not written.is_file():
        return Confirmation(version, False, f"wrote no _virtualenv.py for {pythons.legacy}")
    copied = _kinds(outcome)[VIRTUALENV_COPIED]
    seen = digest(written.read_bytes())
    if seen == copied:
        return Confirmation(version, True, "the venv's _virtualenv.py is the one hashed" + (
            f", its scripts path filled in as {POSIX_SCRIPT_DIR!r}" if VIRTUALENV_PACKAGED in _kinds(outcome) else
            ", byte for byte the packaged file"))  # fmt: skip
    return Confirmation(version, False, f"MISMATCH: the venv's _virtualenv.py hashes {seen}, the one hashed {copied}")


def _kinds(outcome: Outcome) -> dict[str, str]:
    return {found.kind: found.digest for found in outcome.found}


# --- setuptools ----------------------------------------------------------------------------------------------------


def setuptools_outcome(version: Version, folder: Path, wheel_wheel: Path, pythons: Pythons) -> Outcome:
    """Hash this setuptools release's ``_distutils_hack`` and, from 64.0 on, the editable finders it writes."""
    wheel = download(SETUPTOOLS, version, folder / "download")
    outcome = Outcome()
    with zipfile.ZipFile(wheel) as archive:
        hack = sorted(name for name in archive.namelist() if re.fullmatch(r"_distutils_hack/[^/]+\.py", name))
        for name in hack:
            outcome.found.append(Found(digest(archive.read(name)), SETUPTOOLS, version, name))
        if "distutils-precedence.pth" in archive.namelist():
            lines = archive.read("distutils-precedence.pth").decode("utf-8", "replace").splitlines()
            outcome.problems += [Problem(SETUPTOOLS, version, f"distutils-precedence.pth line rejected: {line!r}")
                                 for line in lines if line.startswith("import") and not installer_pth_line(line)]
        elif hack:
            outcome.problems.append(Problem(SETUPTOOLS, version, "_distutils_hack without distutils-precedence.pth"))
    if not hack:
        outcome.skipped = "no _distutils_hack"
    if version >= EDITABLE_FIRST:
        editable_finders(version, wheel, folder, wheel_wheel, pythons.editable, outcome)
    return outcome


def editable_finders(version: Version, setuptools_wheel: Path, folder: Path, wheel_wheel: Path, python: str,
                     outcome: Outcome) -> None:  # fmt: skip
    """Install two small projects editable in a fresh venv with this setuptools and add what they get to ``outcome``."""
    venv = folder / "venv"
    run([python, "-m", "venv", "--without-pip", str(venv)], timeout=TOOL_TIMEOUT_S)
    venv_python = str(venv / "bin" / "python")
    pip = [sys.executable, "-m", "pip", "--python", venv_python, "install", "-q", "--no-deps", "--no-index"]
    build_tools = [str(setuptools_wheel)] + ([str(wheel_wheel)] if version < BDIST_WHEEL_IN_SETUPTOOLS else [])
    run(pip + build_tools, timeout=INSTALL_TIMEOUT_S)
    setuptools_wheel.unlink()
    projects = []
    for name, files in (("flat", FLAT_PROJECT), ("namespace", NAMESPACE_PROJECT)):
        for relative, text in files.items():
            path = folder / name / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        projects += ["-e", str(folder / name)]
    run(pip + ["--no-build-isolation"] + projects, cwd=folder, timeout=INSTALL_TIMEOUT_S)
    site = site_packages(venv)
    finders = sorted(site.glob("__editable___*_finder.py"))
    if len(finders) != 2:
        outcome.problems.append(Problem(SETUPTOOLS, version, f"the editable installs wrote {len(finders)} finders, "
                                        f"not 2: {[path.name for path in site.iterdir()]}"))  # fmt: skip
    for finder in finders:
        content = finder.read_bytes()
        normal = normal_finder(content)
        if normal is None:
            tables = [line for line in content.decode("utf-8", "replace").splitlines()
                      if re.match(r"(MAPPING|NAMESPACES|PATH_PLACEHOLDER)\b", line)]  # fmt: skip
            outcome.problems.append(Problem(SETUPTOOLS, version, f"normal_finder rejects {finder.name}; its table "
                                            f"lines: {tables}"))  # fmt: skip
            continue
        outcome.found.append(Found(digest(normal), SETUPTOOLS, version, "editable finder, normalised"))
        if finder.name == NAMESPACE_FINDER and b"NAMESPACES" in content and "ihns" not in namespaces_line(content):
            outcome.problems.append(Problem(SETUPTOOLS, version, f"{finder.name} lists no namespace package"))
    outcome.problems += pth_problems(SETUPTOOLS, version, site.glob("__editable__*.pth"))


def namespaces_line(content: bytes) -> str:
    lines = [line for line in content.decode("utf-8", "replace").splitlines() if line.startswith("NAMESPACES")]
    return lines[0] if lines else ""


# --- shared --------------------------------------------------------------------------------------------------------


def pth_problems(tool: str, version: Version, paths: Iterable[Path]) -> list[Problem]:
    """The lines Python would run (they start with ``import``) that ``installer_pth_line`` rejects."""
    return [Problem(tool, version, f"{path.name} line rejected: {line!r}") for path in paths
            for line in path.read_text(errors="replace").splitlines()
            if line.startswith(("import ", "import\t")) and not installer_pth_line(line)]  # fmt: skip


def site_packages(venv: Path) -> Path:
    found = glob.glob(str(venv / "lib" / "python3.*" / "site-packages"))
    if len(found) != 1:
        raise StepFailed(f"{venv} has {len(found)} lib/python3.*/site-packages folders, not 1")
    return Path(found[0])


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def run(command: list[str], *, timeout: float, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    try:
        completed = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                                   stdin=subprocess.DEVNULL)  # fmt: skip
    except subprocess.TimeoutExpired as error:
        raise StepFailed(f"{' '.join(command)} ran past {timeout:.0f} s") from error
    if completed.returncode != 0:
        lines = [line for line in (completed.stdout + completed.stderr).splitlines() if "is ignored:" not in line]
        raise StepFailed(f"{' '.join(command)} exited {completed.returncode}: " + " | ".join(lines[-6:]))
    return completed.stdout


def checked_python(path: str | None, lowest: tuple[int, int], below: tuple[int, int], option: str) -> str:
    """``path`` when it is a Python of at least ``lowest`` and below ``below``; exits with what to pass otherwise."""
    wanted = f"a Python >= {lowest[0]}.{lowest[1]} and < {below[0]}.{below[1]}"
    if path is None:
        sys.exit(f"No {wanted} found: pass one with {option}.")
    try:
        output = run([path, "-c", "import sys; print(sys.version_info[0], sys.version_info[1])"], timeout=60)
    except (StepFailed, OSError) as error:
        sys.exit(f"{option} {path} does not run ({error}): pass {wanted}.")
    version = tuple(int(part) for part in output.split())
    if not lowest <= version < below:
        sys.exit(f"{option} {path} is Python {version[0]}.{version[1]}: pass {wanted}.")
    return path


def find_legacy_python() -> str | None:
    """A Python 3.9, 3.8 or 3.7 on PATH or among pyenv's versions."""
    for minor in (9, 8, 7):
        pyenv = sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/3.{minor}.*/bin/python3.{minor}")))
        for candidate in [shutil.which(f"python3.{minor}"), *pyenv]:
            if candidate and subprocess.run([candidate, "-c", ""], capture_output=True).returncode == 0:
                return candidate
    return None


# --- the output ----------------------------------------------------------------------------------------------------


def hashes_module(found: list[Found], newest: dict[str, Version]) -> str:
    """installer_hashes.py: the digests sorted, each under comments naming the releases and files it is."""
    seen: dict[tuple[str, str], set[Version]] = defaultdict(set)
    for item in found:
        seen[(item.tool, item.kind)].add(item.version)
    by_digest: dict[str, dict[tuple[str, str], set[Version]]] = defaultdict(lambda: defaultdict(set))
    for item in found:
        by_digest[item.digest][(item.tool, item.kind)].add(item.version)
    covered = ", ".join(f"{tool} {version}" for tool, version in newest.items())
    lines = [
        '"""SHA-256 of the files Python\'s installers write that Python runs at every start (installer_files.py says '
        "which and",
        "how an editable finder is normalised first). Made by scripts/installer-hashes.py from the installers' "
        "releases; the",
        f"newest releases it covers: {covered}. Rerun it after new releases.\"\"\"",
        "",
        "INSTALLER_HASHES = frozenset({",
    ]
    for hex_digest in sorted(by_digest):
        for (tool, kind), versions in sorted(by_digest[hex_digest].items()):
            ordered = sorted(seen[(tool, kind)])
            text = f"{tool} {version_runs(versions, ordered)}: {kind}"
            lines += textwrap.wrap(text, COMMENT_WIDTH, initial_indent="    # ", subsequent_indent="    #   ")
        lines.append(f'    "{hex_digest}",')
    lines.append("})")
    return "\n".join(lines) + "\n"


def version_runs(versions: set[Version], ordered: list[Version]) -> str:
    """``versions`` as runs of neighbours in ``ordered`` (the releases processed), e.g. ``0.1.0-0.4.30, 0.5.2``."""
    runs: list[list[Version]] = []
    previous_in = False
    for version in ordered:
        inside = version in versions
        if inside and previous_in:
            runs[-1].append(version)
        elif inside:
            runs.append([version])
        previous_in = inside
    return ", ".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


def print_summary(outcomes: dict[str, dict[Version, Outcome]], found: list[Found], confirmations: list[Confirmation],
                  output: Path | None, elapsed: float) -> None:  # fmt: skip
    if output is None:
        print(f"\nA release could not be processed or confirmed (below): nothing written ({elapsed / 60:.1f} min).")
    else:
        print(f"\nWrote {output} in {elapsed / 60:.1f} min.")
    for tool, per_tool in outcomes.items():
        hashed = [version for version, outcome in per_tool.items() if outcome.found]
        skipped = [version for version, outcome in per_tool.items() if outcome.skipped and not outcome.found]
        kinds: dict[str, set[str]] = defaultdict(set)
        for item in found:
            if item.tool == tool:
                kinds[item.kind].add(item.digest)
        span = f" ({min(hashed)}-{max(hashed)})" if hashed else ""
        print(f"{tool}: {len(per_tool)} releases run, {len(hashed)} hashed{span}, {len(skipped)} with nothing to hash"
              + "".join(f"; {len(digests)} distinct {kind}" for kind, digests in sorted(kinds.items())))
        reasons: dict[str, list[Version]] = defaultdict(list)
        for version, outcome in per_tool.items():
            if outcome.skipped and not outcome.found:
                reasons[outcome.skipped].append(version)
        for reason, versions in reasons.items():
            print(f"  {reason}: {version_runs(set(versions), sorted(per_tool))}")
    print(f"distinct digests: {len({item.digest for item in found})}")
    for confirmation in confirmations:
        print(f"virtualenv {confirmation.version}: {confirmation.text}")
    problems = [problem for per_tool in outcomes.values() for outcome in per_tool.values()
                for problem in outcome.problems]  # fmt: skip
    print(f"problems: {len(problems)}")
    for problem in sorted(problems, key=lambda problem: (problem.tool, problem.version)):
        print(f"  {problem.tool} {problem.version}: {problem.reason}")


if __name__ == "__main__":
    sys.exit(main())
