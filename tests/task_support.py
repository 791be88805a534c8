"""Task folders for the tests: the tiny task's ``task.toml``, a task whose verifier says which check failed, and the
small suite the tests of what an eval writes (the Harbor job, the page of a trial) run: such a task, and one whose
``task.toml`` does not parse, so a broken task is in every job they look at."""

from __future__ import annotations

from pathlib import Path

TINY_TOML = """\
version = "1.0"

[metadata]
difficulty = "easy"
category = "files"

[verifier]
timeout_sec = 60

[agent]
timeout_sec = 300

[environment]
cpus = 1
memory_mb = 512
allow_internet = false
"""
VERIFIER = """\
#!/bin/bash
mkdir -p /logs/verifier
python3 -m pytest -p no:cacheprovider -rA /tests/test_outputs.py && echo 1 > /logs/verifier/reward.txt \\
  || echo 0 > /logs/verifier/reward.txt
"""
CHECKS = """\
from pathlib import Path

def test_hello_file():
    assert Path("/app/hello.txt").is_file(), "/app/hello.txt is missing"
    assert Path("/app/hello.txt").read_text() == "hello\\n"
"""
FAILURE = "../tests/test_outputs.py::test_hello_file: AssertionError: /app/hello.txt is missing"


def write_task(root: Path, name: str, category: str = "files", dockerfile_extra: str = "") -> Path:
    task = root / name
    for folder in ("environment", "tests", "solution"):
        (task / folder).mkdir(parents=True)
    (task / "task.toml").write_text(TINY_TOML.replace('category = "files"', f'category = "{category}"'))
    (task / "instruction.md").write_text(f"Task {name}: write the word hello (and a newline) into /app/hello.txt.\n")
    dockerfile = f"FROM terminus-env/base:bookworm\nWORKDIR /app\n{dockerfile_extra}"
    (task / "environment" / "Dockerfile").write_text(dockerfile)
    (task / "tests" / "test.sh").write_text(VERIFIER)
    (task / "tests" / "test_outputs.py").write_text(CHECKS)
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\necho hello > /app/hello.txt\n")
    return task


TASK = "hello-file"
BROKEN = "broken-toml"
TRIALS = 2
FLAKY_SEED = "0"
"""The flaky oracle's draws for hello-file with this seed: trial 0 opens with a reply in no format (a format
error), then solves the task (reward 1); trial 1 gives up at once (reward 0, and the verifier's ``FAILURE``)."""


def small_suite(root: Path) -> Path:
    suite = root / "suite"
    write_task(suite, TASK)
    (write_task(suite, BROKEN) / "task.toml").write_text("this is [not toml\n")
    return suite


def eval_args(suite: Path, output: Path, jobs: Path, *source: str) -> list[str]:
    """``terminus-env eval`` of the suite, the flaky oracle unless another source is given."""
    return ["eval", str(suite), *(source or ("--flaky-oracle", FLAKY_SEED)), "--trials", str(TRIALS),
            "--concurrency", "2", "--output", str(output), "--jobs-dir", str(jobs)]  # fmt: skip
