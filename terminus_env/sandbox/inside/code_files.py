"""Which files are code, and where programs are looked up: facts the daemon's watch and the host's rules share (the
host imports them from here, so the two cannot drift)."""

CODE_SUFFIXES = (".py", ".pyc", ".pyo", ".so", ".pm", ".pl", ".rb", ".js", ".mjs", ".cjs", ".sh", ".jar")
"""Files an interpreter or the loader runs when it opens them. A ``.pth`` is not among them: Python reads it, and runs
only its import lines, which the host's rules judge line by line."""
CODE_MAGIC = (b"\x7fELF", b"#!", b"PK\x03\x04")  # a program, a script, a zip Python imports from
PATH_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
"""Debian's PATH for root, in order: a program found in an earlier folder hides one of a later folder."""
RUNNER_CONFIGS = frozenset({"pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg", "conftest.py"})
"""pytest looks for these upwards from the folder of the tests it runs, /tests, so at / too."""
STARTUP_MODULES = frozenset({"sitecustomize", "usercustomize"})
LOADER_PRELOAD = "/etc/ld.so.preload"
_DECIDING_SUFFIXES = (".pth", ".zip", ".egg", ".whl", "/entry_points.txt")
_DECIDING_FOLDERS = ("/etc/", ".dist-info/", ".egg-info/")


def names_what_runs(path):
    """Whether a file that is not code can still decide what runs by its name or its place: a ``.pth``, an
    archive, a distribution's metadata (entry points register plugins), a runner's configuration, a start-up
    module's name, anything in /etc (the loader's preload list among it). Other data (a test's thousands of output
    files) decides nothing."""
    name = path.rsplit("/", 1)[-1]
    return (path.endswith(_DECIDING_SUFFIXES) or any(folder in path for folder in _DECIDING_FOLDERS)
            or name in RUNNER_CONFIGS or name.split(".")[0] in STARTUP_MODULES)
