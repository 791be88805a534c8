"""``ServeProcess``: a start that hangs fails at its bound, and a restarted replica is the one its pid names."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from terminus_env.serving.serve_process import ServeFailed, ServeProcess, free_ports

HANGING = """#!{python}
# A stand-in for a Python with vLLM: answers the launcher's probe, then starts a replica that never answers.
import sys, time
if sys.argv[1] == "-c":
    sys.exit(0)
time.sleep(600)
"""


def test_a_start_that_never_answers_fails_at_the_bound_it_was_given(tmp_path: Path) -> None:
    stub = tmp_path / "python-with-vllm"
    stub.write_text(HANGING.format(python=sys.executable))
    stub.chmod(0o755)
    args = ["--model", "tiny", "--dp", "1", "--port", str(free_ports(1)), "--device", "cpu", "--python", str(stub)]
    with pytest.raises(ServeFailed, match="not healthy after 2s") as failed:
        ServeProcess(args, tmp_path / "logs", timeout_s=2).start()
    assert "exited with code 1" in str(failed.value)  # the launcher gave up, stopped the replica and exited


def test_replica_pid_names_the_api_server_running_now(tmp_path: Path) -> None:
    """A restarted replica's log holds the dead server's lines, then the new one's."""
    log = ["(APIServer pid=101) INFO starting", "(APIServer pid=101) ERROR died", "(APIServer pid=202) INFO starting",
           "INFO: 127.0.0.1 - GET /health"]
    (tmp_path / "replica-0.log").write_text("\n".join(log) + "\n")
    assert ServeProcess([], tmp_path).replica_pid(0) == 202
    (tmp_path / "replica-1.log").write_text("nothing yet\n")
    with pytest.raises(ServeFailed, match="no 'APIServer pid=' line"):
        ServeProcess([], tmp_path).replica_pid(1)
