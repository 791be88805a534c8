"""verifiers v1: our taskset and env resolved by id as verifiers resolves plugins, and episodes run by verifiers'
own machinery (its interception server, the tool-less ``null`` harness in a subprocess runtime, its eval client)
against the simulated vLLM replica, in our Docker sandbox. Needs ``pip install 'terminus-env[verifiers]'``.

The ``null`` harness prepares its chat program with ``uv``, which fetches the program's dependencies from PyPI
on first use.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
import verifiers.v1 as vf
from verifiers.v1.clients import ModelContext
from verifiers.v1.configs.client import EvalClientConfig
from verifiers.v1.utils.loaders import environment_class, load_environment, taskset_class

from terminus_env.integrations.verifiers import TerminusTaskset, TerminusVfEnv, TerminusVfEnvConfig
from terminus_env.rollout.policy import OracleReplies, oracle_reply
from terminus_env.serving.sim.server import ServerConfig, SimServer

pytestmark = pytest.mark.usefixtures("docker_required")
PLUGIN_ID = "terminus-env-verifiers"
KEY_VAR = "TERMINUS_SIM_API_KEY"


@pytest.fixture(autouse=True)
def uv_on_path(monkeypatch):
    """verifiers runs ``uv`` from PATH; the extra installs it next to this interpreter."""
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv(KEY_VAR, "unused")


def test_taskset_and_env_resolve_by_id_as_verifiers_plugins():
    assert taskset_class(PLUGIN_ID) is TerminusTaskset
    assert environment_class(PLUGIN_ID) is TerminusVfEnv  # the taskset's package exports its env


def run_episode(task, replies, mode="train", max_tokens=None):
    async def main():
        async with SimServer(ServerConfig(model="sim", time_scale=0.0), replies) as server:
            config = TerminusVfEnvConfig(
                taskset={"id": PLUGIN_ID, "tasks_dir": str(task.path.parent), "names": [task.name]},
                tasks_dir=str(task.path.parent),
                mode=mode,
            )
            env = load_environment(config)
            (vtask,) = list(env.taskset)
            client = EvalClientConfig(base_url=f"{server.url}/v1", api_key_var=KEY_VAR)
            ctx = ModelContext(model="sim", client=client, sampling=vf.SamplingConfig(max_tokens=max_tokens))
            async with env.serving():
                return await env.run_episode(vtask, ctx)

    return asyncio.run(main())


def test_an_episode_runs_through_verifiers_and_records_the_verifier_reward(task):
    episode = run_episode(task, OracleReplies([task]))
    assert isinstance(episode, vf.Episode) and episode.ok and not episode.errors
    (trace,) = episode.traces
    assert trace.rewards["terminus"].score == 1.0
    assert trace.metrics["terminus/turns"] == 3.0 and trace.metrics["terminus/format_errors"] == 0.0
    assert len(trace.calls) == 3 and all(call.error is None for call in trace.calls)
    first_user = next(node.message for node in trace.nodes if node.message.role == "user")
    assert task.instruction.strip() in first_user.content  # the env's observation, not the dataset row


def test_strict_semantics_end_a_malformed_first_turn_with_reward_zero(task):
    def stumbles(messages):
        replies = [m["content"] for m in messages if m["role"] == "assistant"]
        if not replies:
            return "I will look around first."  # no <response>
        return oracle_reply(task, sum("<response>" in r for r in replies))  # the oracle, counting accepted turns

    strict = run_episode(task, stumbles, mode="train")
    (trace,) = strict.traces
    assert trace.rewards["terminus"].score == 0.0 and trace.metrics["terminus/format_errors"] == 1.0
    assert trace.metrics["terminus/turns"] == 1.0 and trace.metrics["terminus/graded"] == 0.0

    lenient = run_episode(task, stumbles, mode="eval")
    (trace,) = lenient.traces
    assert trace.rewards["terminus"].score == 1.0 and trace.metrics["terminus/rescued"] == 1.0


def test_a_turn_cut_at_max_tokens_ends_turn_truncated_in_train_mode(task):
    """The engine's finish_reason reaches the env: a reply cut at max_tokens after a complete, task-completing
    <response> is a truncated turn (reward 0, ungraded, in strict mode), not a graded success."""

    def rambles(messages):
        turn = sum(m["role"] == "assistant" for m in messages)
        return oracle_reply(task, turn) + (" and so on" * 100 if turn == 1 else "")

    episode = run_episode(task, rambles, mode="train", max_tokens=80)
    (trace,) = episode.traces
    assert trace.metrics["terminus/truncated_turns"] == 1.0 and trace.metrics["terminus/graded"] == 0.0
    assert trace.rewards["terminus"].score == 0.0
    assert trace.calls[-1].finish_reason == "length" and trace.metrics["terminus/turns"] == 2.0


def test_the_documented_vf_eval_command_runs_strict_episodes(tmp_path):
    """docs/integrations.md's vf-eval command line (fewer turns, one task, the simulated replica as the server): it
    runs our env in strict mode and the traces carry the reward and the env's metrics."""
    import json
    import subprocess

    from serving_support import SimProcesses

    sims = SimProcesses(tmp_path)
    try:
        _, url = sims.start("--model", "sim", "--time-scale", "0")
        cmd = ["vf-eval", PLUGIN_ID, "--model", "sim", "--client.base-url", f"{url}/v1", "--client.api-key-var",
               KEY_VAR, "--env.mode", "train", "--env.max-turns", "2", "--env.max-turn-tokens", "4096",
               "--sampling.max-tokens", "4096", "--env.taskset.names", "hello-world", "-r", "2", "--no-push",
               "-o", str(tmp_path / "outputs")]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=os.environ.copy())
    finally:
        sims.close()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (traces_file,) = (tmp_path / "outputs").glob("*/traces.jsonl")
    episodes = [json.loads(line) for line in traces_file.read_text().splitlines()]
    assert len(episodes) == 2 and all(e["ok"] for e in episodes)
    for episode in episodes:
        (trace,) = episode["traces"]
        # The simulated replies are well-formed and never complete: two turns, then the turn cap, graded.
        assert trace["rewards"]["terminus"]["score"] == 0.0
        assert trace["metrics"]["terminus/turns"] == 2.0 and trace["metrics"]["terminus/graded"] == 1.0
