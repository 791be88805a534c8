"""The ``config.json`` and ``result.json`` Harbor 0.26 writes for a job and for each trial, built from a run file.

The keys are the ones Harbor 0.26.0 writes for a job of its own, so Harbor's viewer and its Pydantic models
read them; the values say what this package did. What has no Harbor counterpart
goes where Harbor keeps free-form data: the run's options in the agent's ``kwargs``, the episode summary
(end reason, format errors, the first failing test) and the task's category in ``agent_result.metadata``.

Rewards: every valid trial has ``verifier_result.rewards.reward``, the env's reward (0 for endings that are the
agent's doing and ungraded, such as a strict format error). A trial the infrastructure failed (``env_error``),
or that never ran because its task did not load or build, has ``exception_info`` and no reward, as in Harbor.
Pure: records in, JSON-ready dicts out.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from terminus_env.records import stats
from terminus_env.records.atif import AgentSpec, token_total
from terminus_env.records.run_log import RolloutRecord, TaskErrorRecord
from terminus_env.records.timeline import instant, iso

SCHEMA_VERSION = 1
REWARD_KEY = "reward"
DATASET = "adhoc"  # Harbor's name for tasks given by path rather than by a registry dataset
_ERROR_TYPE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*): ")


@dataclass(frozen=True)
class JobInfo:
    """What every trial of a job shares."""

    job_id: str
    job_dir: Path
    agent: AgentSpec
    task_paths: Mapping[str, Path]
    """Each task's folder, by task name."""


def trial_name(task: str, trial: int) -> str:
    """A trial's folder name: Harbor's ``<task>__<id>``, with the trial number as the id so a resumed run writes
    the same names."""
    return f"{task}__{trial}"


def trial_id(job: JobInfo, name: str) -> str:
    """Stable across rewrites of the same job."""
    return str(uuid.uuid5(uuid.UUID(job.job_id), name))


def agent_config(agent: AgentSpec) -> dict[str, Any]:
    return {
        "name": agent.name, "import_path": None, "model_name": agent.model_name, "base_url": None,
        "model_api_key_name": None, "model_api_format": None, "skip_model_parsing": False, "n_concurrent": None,
        "concurrency_group": None, "skills": [], "override_timeout_sec": None, "override_setup_timeout_sec": None,
        "max_timeout_sec": None, "resume_trajectory": False, "load_trajectory": None, "extra_allowed_hosts": [],
        "kwargs": dict(agent.options), "mcp_servers": [],
    }  # fmt: skip


def job_config(job: JobInfo, *, trials: int, concurrency: int) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "job_name": job.job_dir.name,
        "jobs_dir": str(job.job_dir.parent),
        "n_attempts": trials,
        "install_only": False,
        "skip_credential_checks": False,
        **_TIMEOUT_MULTIPLIERS,
        "debug": False,
        "n_concurrent_trials": concurrency,
        "quiet": False,
        "retry": {
            "max_retries": 0,
            "include_exceptions": None,
            "exclude_exceptions": None,
            "wait_multiplier": 1.0,
            "min_wait_sec": 1.0,
            "max_wait_sec": 60.0,
        },  # fmt: skip
        "override_error_policy": {},
        "environment": _ENVIRONMENT,
        "verifier": _VERIFIER,
        "metrics": [],
        "agents": [agent_config(job.agent)],
        "user_agent": None,
        "datasets": [],
        "tasks": [_task_config(path) for path in job.task_paths.values()],
        **_NO_EXTRAS,
        "source_jobs": [],
    }


def trial_config(job: JobInfo, task: str, name: str) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "task": _task_config(_task_path(job, task)),
        "trial_name": name,
        "trials_dir": str(job.job_dir),
        "install_only": False,
        **_TIMEOUT_MULTIPLIERS,
        "agent": agent_config(job.agent),
        "user_agent": None,
        "environment": _ENVIRONMENT,
        "verifier": _VERIFIER,
        "override_error_policy": {},
        **_NO_EXTRAS,
        "job_id": job.job_id,
        "source_trial": None,
    }


def rollout_result(job: JobInfo, record: RolloutRecord, checksum: str) -> dict[str, Any]:
    """A finished rollout's ``result.json``."""
    trajectory = record.trajectory or {}
    turns = trajectory.get("turns") or []
    started = trajectory.get("started_at")
    finished = None if started is None else started + record.wall_s
    ready = instant(trajectory, trajectory.get("ready_s"))
    last = instant(trajectory, turns[-1].get("observed_s")) if turns else None
    grade_s = trajectory.get("grade_s")
    agent_end = last - grade_s if last is not None and grade_s is not None else last
    error = None
    if record.env_error:
        error = _exception(trajectory.get("error") or (record.summary or {}).get("error") or record.end_reason,
                           finished)  # fmt: skip
    return _trial_result(
        job, record.task, trial_name(record.task, record.trial), checksum,
        agent_result={
            "n_input_tokens": token_total(turns, "prompt_tokens"), "n_cache_tokens": None,
            "n_output_tokens": token_total(turns, "completion_tokens"), "cost_usd": None, "model_usage": None,
            "rollout_details": None,
            "metadata": {"end_reason": record.end_reason, "category": record.category, **(record.summary or {}),
                         "detail": record.detail},
        },
        rewards=None if record.env_error else {REWARD_KEY: record.reward},
        exception_info=error,
        started_at=started, finished_at=finished,
        phases={
            "environment_setup": _window(started, ready),
            "agent_setup": None,
            "agent_execution": _window(ready, agent_end),
            "verifier": _window(agent_end, last) if grade_s is not None else None,
        },
    )  # fmt: skip


def trial_log(record: RolloutRecord) -> str:
    """The trial's ``trial.log``: what happened, a line per event, stamped with its time when the run recorded it."""
    trajectory = record.trajectory or {}
    summary = record.summary or {}

    def line(offset: float | None, text: str) -> str:
        moment = instant(trajectory, offset)
        return f"{iso(moment) if moment is not None else '-'} {text}"

    lines = [line(0.0, f"{record.task} #{record.trial}: started")]
    if trajectory.get("ready_s") is not None:
        lines.append(line(trajectory["ready_s"], "the sandbox is up and the first observation ready"))
    attempts: dict[int, list[dict[str, Any]]] = {c["turn"]: [] for c in trajectory.get("compactions") or []}
    for compaction in trajectory.get("compactions") or []:
        attempts[compaction["turn"]].append(compaction)
    turns = trajectory.get("turns") or []
    for index, turn in enumerate(turns):
        for compaction in attempts.get(index, []):
            lines.append(line(compaction.get("at_s"), _compaction_line(compaction)))
        if turn.get("format_error"):
            lines.append(line(turn.get("replied_s"), f"turn {index + 1}: format error: {turn['format_error']}"))
        if turn.get("finish_reason") == "length":
            lines.append(line(turn.get("replied_s"), f"turn {index + 1}: the reply filled the per-turn token limit"))
    for compaction in attempts.get(len(turns), []):
        lines.append(line(compaction.get("at_s"), _compaction_line(compaction)))
    end = trajectory.get("wall_s", record.wall_s)
    lines.append(line(end, f"ended: {record.end_reason} after {len(turns)} turns, reward {record.reward:g}"))
    if trajectory.get("grade_s") is not None:
        lines.append(line(end, f"the verifier ran for {trajectory['grade_s']:g} s"))
    for key in ("grade_reason", "failure", "error"):
        if summary.get(key):
            lines.append(line(end, f"{key.replace('_', ' ')}: {summary[key]}"))
    if trajectory.get("error"):
        lines.append(line(end, f"error: {trajectory['error']}"))
    return "\n".join(lines) + "\n"


def _compaction_line(compaction: Mapping[str, Any]) -> str:
    free = compaction.get("free_tokens")
    why = f"{compaction['trigger']}, {free} tokens free" if free is not None else compaction["trigger"]
    asked = ", ".join(f"{c['role']} ({c['finish_reason']})" for c in compaction.get("calls") or []) or "no request"
    if compaction["outcome"] == "failed":
        return f"context summarization ({why}) did not complete and the conversation goes on: {asked}"
    return f"context summarization ({why}): {compaction['outcome']}, from {asked}"


def task_error_result(job: JobInfo, error: TaskErrorRecord, trial: int, checksum: str, at: float) -> dict[str, Any]:
    """The ``result.json`` of a trial that never ran: its task did not load, or its image did not build."""
    return _trial_result(
        job, error.task, trial_name(error.task, trial), checksum, agent_result=None, rewards=None,
        exception_info=_exception(error.error, at), started_at=at, finished_at=at,
        phases={"environment_setup": None, "agent_setup": None, "agent_execution": None, "verifier": None},
    )  # fmt: skip


def job_result(
    job: JobInfo, trials: Sequence[Mapping[str, Any]], *, n_total: int, report: stats.Report | None,
    started_at: float, finished_at: float | None,
) -> dict[str, Any]:  # fmt: skip
    """The job's ``result.json``: Harbor's counts and its per-agent statistics over the trials' results."""
    key = f"{job.agent.name}__{job.agent.model_name}__{DATASET}" if job.agent.model_name else \
        f"{job.agent.name}__{DATASET}"  # fmt: skip
    valid = [t for t in trials if t["reward_valid"]]
    errored = [t for t in trials if t["exception_info"] is not None]
    rewards: dict[str, list[str]] = {}
    for t in valid:
        rewards.setdefault(str(float(t["verifier_result"]["rewards"][REWARD_KEY])), []).append(t["trial_name"])
    exceptions: dict[str, list[str]] = {}
    for t in errored:
        exceptions.setdefault(t["exception_info"]["exception_type"], []).append(t["trial_name"])
    values = [t["verifier_result"]["rewards"][REWARD_KEY] for t in valid]
    pass_at_k = {}
    if report is not None and report.k > 1 and report.overall.pass_at_k is not None:
        pass_at_k = {str(report.k): report.overall.pass_at_k}
    evals = {
        "n_trials": len(valid),
        "n_errors": len(errored),
        "metrics": [{"mean": sum(values) / len(values)}] if values else [],
        "pass_at_k": pass_at_k,
        "reward_stats": {REWARD_KEY: rewards} if rewards else {},
        "exception_stats": exceptions,
    }
    stamp = finished_at if finished_at is not None else started_at
    return {
        "schema_version": SCHEMA_VERSION,
        "id": job.job_id,
        "started_at": iso(started_at),
        "updated_at": iso(stamp),
        "finished_at": None if finished_at is None else iso(finished_at),
        "n_total_trials": n_total,
        "stats": {
            "n_completed_trials": len(trials),
            "n_errored_trials": len(errored),
            "n_running_trials": 0,
            "n_pending_trials": max(n_total - len(trials), 0),
            "n_cancelled_trials": 0,
            "n_retries": 0,
            "evals": {key: evals} if trials else {},
            "n_input_tokens": _sum_of(trials, "n_input_tokens"),
            "n_cache_tokens": None,
            "n_output_tokens": _sum_of(trials, "n_output_tokens"),
            "cost_usd": None,
        },
    }


def _trial_result(
    job: JobInfo, task: str, name: str, checksum: str, *, agent_result: dict[str, Any] | None,
    rewards: dict[str, float] | None, exception_info: dict[str, Any] | None, started_at: float | None,
    finished_at: float | None, phases: dict[str, dict[str, str] | None],
) -> dict[str, Any]:  # fmt: skip
    path = _task_path(job, task)
    return {
        "schema_version": SCHEMA_VERSION,
        "id": trial_id(job, name),
        "task_name": task,
        "trial_name": name,
        "trial_uri": (job.job_dir / name).resolve().as_uri(),
        "task_id": {"path": str(path)},
        "source": None,
        "task_checksum": checksum,
        "config": trial_config(job, task, name),
        "agent_info": {
            "name": job.agent.name,
            "version": job.agent.version,
            "model_info": {"name": job.agent.model_name, "provider": None} if job.agent.model_name else None,
        },
        "agent_result": agent_result,
        "verifier_result": None if rewards is None else {"rewards": rewards},
        "verifier_environment_mode": "shared",  # the verifier runs in the agent's container, after the episode
        "exception_info": exception_info,
        "started_at": None if started_at is None else iso(started_at),
        "finished_at": None if finished_at is None else iso(finished_at),
        **phases,
        "step_results": None,
        "reward_valid": rewards is not None and exception_info is None,
    }


def _task_path(job: JobInfo, task: str) -> Path:
    return job.task_paths.get(task) or job.job_dir / task


def _task_config(path: Path) -> dict[str, Any]:
    return {"path": str(path), "git_url": None, "git_commit_id": None, "name": None, "ref": None,
            "overwrite": False, "download_dir": None, "source": None}  # fmt: skip


def _exception(error: str, at: float | None) -> dict[str, Any]:
    """Harbor's exception record from our ``Type: message`` error strings (no traceback is kept)."""
    match = _ERROR_TYPE.match(error)
    kind, message = (match.group(1), error[match.end() :]) if match else ("EnvError", error)
    return {"exception_type": kind, "exception_message": message, "exception_traceback": "",
            "occurred_at": None if at is None else iso(at)}  # fmt: skip


def _window(start: float | None, end: float | None) -> dict[str, str] | None:
    if start is None or end is None:
        return None
    return {"started_at": iso(start), "finished_at": iso(max(start, end))}


def _sum_of(trials: Sequence[Mapping[str, Any]], key: str) -> int | None:
    values = [t["agent_result"][key] for t in trials if t["agent_result"] and t["agent_result"][key] is not None]
    return sum(values) if values else None


_TIMEOUT_MULTIPLIERS = {
    "timeout_multiplier": 1.0, "agent_timeout_multiplier": None, "verifier_timeout_multiplier": None,
    "agent_setup_timeout_multiplier": None, "environment_build_timeout_multiplier": None,
}  # fmt: skip
_ENVIRONMENT: dict[str, Any] = {
    "type": "docker", "import_path": None, "force_build": False, "delete": True, "stream": False,
    "cpu_enforcement_policy": "auto", "memory_enforcement_policy": "auto", "override_cpus": None,
    "override_memory_mb": None, "override_storage_mb": None, "override_gpus": None, "override_tpu": None,
    "mounts": None, "extra_docker_compose": [], "kwargs": {}, "extra_allowed_hosts": [],
}  # fmt: skip
_VERIFIER = {"override_timeout_sec": None, "max_timeout_sec": None, "disable": False}
_NO_EXTRAS: dict[str, list[Any]] = {"artifacts": [], "extra_instruction_paths": [], "extra_instructions": []}
