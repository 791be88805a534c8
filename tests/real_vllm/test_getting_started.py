"""docs/getting-started.md's CPU-only path, run as the page writes it: a tiny model, two real vLLM replicas from
``terminus-env serve``, a strict eval against them, and two GRPO steps with TRL that sync the weights into them.

The install lines are not run (``make test-vllm`` installed the same into ``.venv-vllm``, which runs this; the first
test checks that they are the same); every other line runs through bash as written, from a folder that stands for
the clone, with the port moved to free ones and ``--output``/``--json`` added to the training command to look at
what it did. Then every replica must serve the weights of step 2, as ``transformers`` computes them.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM
from vllm_support import START_TIMEOUT_S, expected_logprobs

from terminus_env.cli import main as cli_main
from terminus_env.records.step_log import read_step_log
from terminus_env.serving import ReplicaClient
from terminus_env.serving.serve_process import free_ports

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "getting-started.md"
SECTION = "## From a clone to GRPO on a CPU-only machine"
# Each command's bound, only to stop a hang (on the shared 2-core machine the model takes seconds, the eval under a
# minute and the two GRPO steps one or two); pytest-timeout's is above their sum and the replicas' start.
MODEL_TIMEOUT_S, EVAL_TIMEOUT_S, TRAIN_TIMEOUT_S, STOP_TIMEOUT_S = 120, 300, 600, 120
PAGE_TIMEOUT_S = MODEL_TIMEOUT_S + int(START_TIMEOUT_S) + EVAL_TIMEOUT_S + TRAIN_TIMEOUT_S + STOP_TIMEOUT_S + 60


def blocks() -> list[list[str]]:
    """The section's bash blocks, as lists of lines."""
    text = DOC.read_text()
    section = text[text.index(SECTION) :]
    end = section.find("\n## ", 1)
    section = section if end < 0 else section[:end]
    return [block.strip().splitlines() for block in re.findall(r"```bash\n(.*?)```", section, re.S)]


def test_the_pages_install_lines_are_what_make_test_vllm_installs():
    install, _ = blocks()
    script = (ROOT / "scripts" / "test-vllm.sh").read_text()
    assert install[1] == "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
    assert '"$venv/bin/pip" install -q torch==2.13.0' in script  # the same build (here from the machine's disk)
    extras = set(re.fullmatch(r"pip install '\.\[([\w,-]+)\]'", install[2]).group(1).split(","))
    assert extras <= set(re.search(r'-e "\.\[([\w,-]+)\]"', script).group(1).split(","))
    assert install[3] == "pip uninstall -y torchvision torchaudio torchcodec"
    assert "uninstall -q -y torchvision torchaudio torchcodec" in script


@pytest.mark.usefixtures("docker_required")
@pytest.mark.timeout(PAGE_TIMEOUT_S)
def test_the_pages_commands_run_as_written(tmp_path, replica_logs):
    first, second = blocks()
    make_model, serve = first[4], first[5]
    evaluate, train = second
    clone = tmp_path / "clone"  # the commands run from the clone: examples/ there, the model made beside it
    clone.mkdir()
    (clone / "examples").symlink_to(ROOT / "examples")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}  # the activated venv
    port = free_ports(2)

    def moved(line: str) -> str:
        return line.replace("127.0.0.1:8000", f"127.0.0.1:{port}").replace("127.0.0.1:8001", f"127.0.0.1:{port + 1}")

    def run(line: str, timeout_s: float) -> subprocess.CompletedProcess:
        done = subprocess.run(["bash", "-c", line], cwd=clone, env=env, capture_output=True, text=True,
                              timeout=timeout_s)  # fmt: skip
        assert done.returncode == 0, f"{line}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done

    run(make_model, MODEL_TIMEOUT_S)
    logs = replica_logs("getting-started")
    serve_line = serve.replace(" serve ", f" serve --port {port} --log-dir {shlex.quote(str(logs))} ", 1)
    launcher = subprocess.Popen(["bash", "-c", f"exec env {serve_line}"], cwd=clone, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    try:
        printed = ready(launcher)
        assert printed[-1] == (f"evaluate with: terminus-env eval --model tiny --base-url http://127.0.0.1:{port} "
                               f"--base-url http://127.0.0.1:{port + 1}")  # fmt: skip
        assert [line.endswith(f"seed {i})") for i, line in enumerate(printed[1:3])] == [True, True]
        evaluated = run(moved(evaluate) + f" --run-file {tmp_path / 'eval.jsonl'} --jobs-dir {tmp_path / 'jobs'}",
                        EVAL_TIMEOUT_S)
        assert re.search(r"end reasons: (format_error|context_limit) 1", evaluated.stdout), evaluated.stdout[-2000:]
        out = tmp_path / "grpo"
        trained = run(moved(train) + f" --output {out} --json {tmp_path / 'grpo.json'}", TRAIN_TIMEOUT_S)
        print("\n" + "\n".join(trained.stdout.splitlines()[-3:]))
        urls = [f"http://127.0.0.1:{port + i}" for i in (0, 1)]
        check_training(json.loads((tmp_path / "grpo.json").read_text()), urls)
        check_step_log(out / "steps.jsonl", json.loads((tmp_path / "grpo.json").read_text()))
        check_replicas_serve(out / "checkpoints" / "step-2", clone / "tiny", port)
    finally:
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=STOP_TIMEOUT_S)
        launcher.stdout.close()


def ready(launcher: subprocess.Popen) -> list[str]:
    """What the launcher printed up to ``evaluate with:``."""
    lines, deadline = [], time.monotonic() + START_TIMEOUT_S
    for line in launcher.stdout:
        lines.append(line.rstrip())
        if line.startswith("evaluate with:"):
            return lines
        assert time.monotonic() < deadline, lines
    raise AssertionError(f"serve exited with {launcher.wait()}: {lines[-20:]}")


def check_training(result: dict, urls: list[str]) -> None:
    steps = result["steps"]
    assert [s["step"] for s in steps] == [1, 2] and [s["version"] for s in steps] == ["1", "2"]
    for s in steps:
        assert s["replicas"] == urls
        assert 0 < s["rollout_s"] < s["total_s"] and 0 < s["sync_s"] < s["total_s"] and s["training_s"] > 0
    logged = [entry for entry in result["log_history"] if "loss" in entry]
    assert len(logged) == 2
    for entry in logged:  # the env's metrics and the timings in the trainer's log
        for key in ("env/mean_reward", "env/mean_turns", "env/untrained_token_share", "time/rollout_s",
                    "time/weight_sync_s"):  # fmt: skip
            assert key in entry, (key, entry)
        assert entry["env/mean_turns"] >= 1 and entry["env/untrained_token_share"] == 0.0


def check_step_log(path: Path, result: dict) -> None:
    """The example's step log: a line per step with the mean reward the trainer logged; the training run's page."""
    steps = read_step_log(path)
    logged = [entry for entry in result["log_history"] if "loss" in entry]
    assert [s.step for s in steps] == [1, 2]
    assert all(s.episodes > 0 and sum(s.end_reasons.values()) == s.episodes for s in steps)
    assert [s.mean_reward for s in steps] == pytest.approx([entry["env/mean_reward"] for entry in logged])
    assert cli_main(["view", str(path)]) == 0 and path.with_suffix(".html").is_file()


def check_replicas_serve(step2: Path, initial: Path, port: int) -> None:
    """Every replica serves the weights of step 2 (and no longer the initial ones), as transformers computes them."""
    trained = AutoModelForCausalLM.from_pretrained(step2, dtype=torch.float32)
    start = AutoModelForCausalLM.from_pretrained(initial, dtype=torch.float32)
    prompt, continuation = list(range(5, 60)), [7, 99, 311, 23, 5, 640]

    async def scored(url: str) -> list[float]:
        async with ReplicaClient(url) as client:
            return await client.continuation_logprobs("tiny", prompt, continuation)

    for i in (0, 1):
        got = torch.tensor(asyncio.run(scored(f"http://127.0.0.1:{port + i}")))
        assert torch.allclose(got, expected_logprobs(trained, prompt, continuation), atol=2e-3)
        assert not torch.allclose(got, expected_logprobs(start, prompt, continuation), atol=2e-3)
