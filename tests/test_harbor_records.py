"""The Harbor records of rollouts a real eval rarely produces on purpose: one whose sandbox never started (an
``env_error`` with no observation), and one from a run file written before times were recorded."""

from __future__ import annotations

import uuid
from pathlib import Path

from terminus_env.records.atif import agent_spec, atif_trajectory
from terminus_env.records.cast import asciinema_cast
from terminus_env.records.harbor_records import JobInfo, job_result, rollout_result
from terminus_env.records.run_log import RolloutRecord, RunConfig

CONFIG = RunConfig(folder="/suite", names=(), trials=1, policy="model:qwen", strict_format=False,
                   strict_truncation=False, max_turns=30, max_turn_tokens=16384)  # fmt: skip
JOB = JobInfo(str(uuid.uuid4()), Path("/jobs/run"), agent_spec(CONFIG), {"t": Path("/suite/t")})


def test_a_rollout_that_never_started_is_an_exception_without_a_reward_or_a_trajectory() -> None:
    trajectory = {"rollout_id": "t#0", "task": "t", "messages": [], "turns": [], "started_at": 1_800_000_000.0,
                  "error": "SandboxError: the container did not start", "ready_s": None, "screen": None}  # fmt: skip
    record = RolloutRecord(task="t", trial=0, reward=0.0, end_reason="env_error", env_error=True, wall_s=2.5,
                           trajectory=trajectory)  # fmt: skip
    result = rollout_result(JOB, record, checksum="abc")
    assert result["exception_info"]["exception_type"] == "SandboxError"
    assert result["exception_info"]["exception_message"] == "the container did not start"
    assert result["verifier_result"] is None and result["reward_valid"] is False
    assert result["environment_setup"] is None and result["verifier"] is None
    assert result["agent_info"]["model_info"] == {"name": "qwen", "provider": None}
    assert atif_trajectory(record, JOB.agent) is None and asciinema_cast(trajectory, "t #0") is None
    job = job_result(JOB, [result], n_total=2, report=None, started_at=1_800_000_000.0, finished_at=None)
    assert job["finished_at"] is None and job["stats"]["n_pending_trials"] == 1
    assert job["stats"]["evals"]["terminus-env__qwen__adhoc"]["exception_stats"] == {"SandboxError": ["t__0"]}


def test_a_record_without_times_still_maps_its_turns() -> None:
    reply = "<response><analysis>a</analysis><plan>p</plan><commands><keystrokes>ls\n</keystrokes></commands>"
    reply += "</response>"
    trajectory = {"rollout_id": "t#0", "messages": [{"role": "user", "content": "start"},
                                                    {"role": "assistant", "content": reply}],
                  "turns": [{"reply": reply, "finish_reason": "stop", "prompt_tokens": 10, "completion_tokens": 5}]}
    record = RolloutRecord(task="t", trial=0, reward=1.0, end_reason="task_complete", env_error=False,
                           trajectory=trajectory)  # fmt: skip
    document = atif_trajectory(record, JOB.agent)
    assert [s["source"] for s in document["steps"]] == ["user", "agent"]
    assert all("timestamp" not in s for s in document["steps"])  # unknown, so left out rather than made up
    assert "tool_calls" not in document["steps"][1]  # what was typed was not recorded
    assert document["final_metrics"] == {"total_prompt_tokens": 10, "total_completion_tokens": 5, "total_steps": 2}
    result = rollout_result(JOB, record, checksum="")
    assert result["started_at"] is None and result["verifier_result"] == {"rewards": {"reward": 1.0}}
    assert asciinema_cast(trajectory, "t #0") is None
