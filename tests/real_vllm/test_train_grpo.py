"""``examples/train_grpo.py``: two GRPO steps with TRL on shipped tasks, rollouts from the real replicas, the new
weights loaded into every replica after each step, as a user runs it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM
from vllm_support import MODEL_NAME, expected_logprobs, probe

from terminus_env.serving import ServingPool
from terminus_env.serving.weight_sync import CheckpointReload

pytestmark = pytest.mark.usefixtures("docker_required")
EXAMPLE = Path(__file__).parents[2] / "examples" / "train_grpo.py"


def test_two_grpo_steps_train_on_real_rollouts_and_sync_the_replicas(fleet, model_dir, tmp_path):
    out = tmp_path / "grpo.json"
    cmd = [sys.executable, str(EXAMPLE), "--model", str(model_dir), "--served-model-name", MODEL_NAME,
           "--base-url", fleet.urls[0], "--base-url", fleet.urls[1], "--steps", "2",
           "--learning-rate", "0.05", "--weight-decay", "1.0",
           "--output", str(tmp_path / "run"), "--json", str(out)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    print("\n" + "\n".join(done.stdout.splitlines()[-3:]))
    result = json.loads(out.read_text())
    steps = result["steps"]
    assert [s["step"] for s in steps] == [1, 2] and [s["version"] for s in steps] == ["1", "2"]
    for s in steps:
        assert s["replicas"] == fleet.urls
        assert 0 < s["rollout_s"] < s["total_s"] and 0 < s["sync_s"] < s["total_s"] and s["training_s"] > 0
    logged = [entry for entry in result["log_history"] if "loss" in entry]
    assert len(logged) == 2
    for entry in logged:  # the env's metrics and the timings in the trainer's log
        for key in ("env/mean_reward", "env/mean_turns", "env/untrained_token_share", "time/rollout_s",
                    "time/weight_sync_s"):  # fmt: skip
            assert key in entry, (key, entry)
        assert entry["env/mean_turns"] >= 1 and entry["env/untrained_token_share"] == 0.0

    # Every replica now serves the weights of step 2, as transformers computes them from the saved checkpoint.
    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "checkpoints" / "step-2", dtype=torch.float32)
    initial = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)

    async def main():
        seen = [await probe(url) for url in fleet.urls]
        async with ServingPool(fleet.urls, MODEL_NAME) as pool:  # the other tests' weights again
            await pool.sync_weights(CheckpointReload(str(model_dir)), version=0)
        return seen

    for c, _ in asyncio.run(main()):
        got = torch.tensor(c.logprobs)
        assert torch.allclose(got, expected_logprobs(trained, c.prompt_token_ids, c.token_ids), atol=2e-3)
        assert not torch.allclose(got, expected_logprobs(initial, c.prompt_token_ids, c.token_ids), atol=2e-3)
