"""SkyRL: ``TerminusGenerator``, a step-wise generator, and ``TerminusTextEnv``, a ``skyrl_gym`` text env.

``TerminusGenerator`` implements ``GeneratorInterface.generate(GeneratorInput) -> GeneratorOutput``
on SkyRL's event loop. Each input row names its task in ``env_extras[i]["task"]`` (or its prompt
holds the instruction); its ``trajectory_ids[i]`` (``TrajectoryID(instance_id, repetition_id)``)
makes the GRPO groups. It returns step-wise rows (``generator.step_wise_trajectories``): one row
per model turn with the prompt the engine saw and the tokens it generated, the episode's reward
on the last token of the last step, ``is_last_step`` and the trajectory id on every row; SkyRL's
``validate_generator_output(step_wise=True)`` accepts them. Masking follows a
:class:`~terminus_env.training.MaskingPolicy`: env errors always, and by default, as SkyRL's
Harbor integration does, agent timeouts and ``max_turns`` too, over the whole group.

Replies come from any :class:`~terminus_env.rollout.policy.Policy`, usually a
:class:`~terminus_env.rollout.ServingPolicy` over the vLLM servers SkyRL starts with HTTP
endpoints; its ``policy_version`` follows ``batch_metadata.global_step``.

``TerminusTextEnv`` is registered in ``skyrl_gym`` as ``terminus`` by :func:`register`: the
lighter path, where SkyRL's own generator tokenizes and the env sees text. It steps the sync env,
whose loop every sync env of the process shares (SkyRL steps envs in a thread pool).

    pip install 'terminus-env[skyrl]'     # Python >= 3.12
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import skyrl_gym
from skyrl.train.generators.base import GeneratorInput, GeneratorInterface, GeneratorOutput, TrajectoryID
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

from terminus_env.env import TerminusEnv
from terminus_env.integrations.task_lookup import TaskLookup, hackable_share
from terminus_env.records.metrics import aggregate
from terminus_env.rollout import RolloutRunner, ServingPolicy
from terminus_env.rollout.policy import Policy, Rollout
from terminus_env.rollout.trajectory import Trajectory
from terminus_env.sandbox import SandboxPool
from terminus_env.tasks import Task, find_task
from terminus_env.training import MaskingPolicy, MaskScope, StepRow, TimeLimitEnds, step_rows

ENV_ID = "terminus"
HARBOR_MASKING = MaskingPolicy(time_limits=TimeLimitEnds.MASKED, scope=MaskScope.GROUP)


class TerminusGenerator(GeneratorInterface):
    """SkyRL's generator for terminal tasks: each input row is one episode, returned as step-wise rows."""

    def __init__(
        self,
        policy: Policy,
        tasks: Sequence[Task],
        *,
        env_kwargs: Mapping[str, Any] | None = None,
        masking: MaskingPolicy = HARBOR_MASKING,
        sandbox_pool: SandboxPool | None = None,
        max_sandboxes: int = 8,
        pad_token_id: int = 0,
        audit_report: str | Path | None = None,
        hackable: str = "skip",
    ) -> None:
        self.policy = policy
        self.tasks = TaskLookup(tasks, audit_report=audit_report, hackable=hackable)
        self.masking = masking
        self.pad_token_id = pad_token_id
        self.runner = RolloutRunner(
            policy, env_kwargs={"mode": "train", **dict(env_kwargs or {})}, sandbox_pool=sandbox_pool,
            max_sandboxes=max_sandboxes,
        )
        self.last_trajectories: list[Trajectory] = []

    async def generate(self, input_batch: GeneratorInput) -> GeneratorOutput:
        prompts = input_batch["prompts"]
        extras = input_batch.get("env_extras") or [{} for _ in prompts]
        ids = input_batch.get("trajectory_ids") or [TrajectoryID(f"prompt-{i}", 0) for i in range(len(prompts))]
        metadata = input_batch.get("batch_metadata")
        if metadata is not None and isinstance(self.policy, ServingPolicy):
            self.policy.policy_version = metadata.global_step
        rollouts = [
            Rollout(tid.to_string(), tid.instance_id, self.tasks.for_row(extra, prompt))
            for prompt, extra, tid in zip(prompts, extras, ids, strict=True)
        ]
        trajectories = list(await asyncio.gather(*(self.runner.run_one(r) for r in rollouts)))
        self.last_trajectories = trajectories
        return self.output(trajectories, ids)

    def output(self, trajectories: Sequence[Trajectory], ids: Sequence[TrajectoryID]) -> GeneratorOutput:
        """Step-wise rows in SkyRL's shape; a rollout with no model turn keeps one masked row."""
        by_rollout: dict[str, list[StepRow]] = {}
        for row in step_rows(trajectories, self.masking):
            by_rollout.setdefault(row.rollout_id, []).append(row)
        out: dict[str, list] = {
            key: []
            for key in (
                "prompt_token_ids",
                "response_ids",
                "rewards",
                "loss_masks",
                "stop_reasons",
                "rollout_logprobs",
                "trajectory_ids",
                "is_last_step",
            )
        }
        logprobs_complete = True
        for trajectory, tid in zip(trajectories, ids, strict=True):
            rows = by_rollout.get(trajectory.rollout_id) or [_placeholder(trajectory, self.pad_token_id)]
            for row in rows:
                rewards = [0.0] * len(row.response_ids)
                if rewards:
                    rewards[-1] = row.reward  # SkyRL's step-wise rewards: per token, at the step's last token
                out["prompt_token_ids"].append(row.prompt_ids)
                out["response_ids"].append(row.response_ids)
                out["rewards"].append(rewards)
                out["loss_masks"].append(row.loss_mask)
                out["stop_reasons"].append(row.stop_reason)
                out["rollout_logprobs"].append(row.logprobs)
                out["trajectory_ids"].append(tid)
                out["is_last_step"].append(row.is_last_step)
                logprobs_complete = logprobs_complete and row.logprobs is not None
        metrics = aggregate([t for t in trajectories if t.summary is not None]).as_dict()
        end_reasons = metrics.pop("end_reasons")
        rollout_metrics = {f"terminus/{k}": float(v) for k, v in metrics.items()}
        rollout_metrics.update({f"terminus/end_reason/{k}": float(v) for k, v in end_reasons.items()})
        rollout_metrics["terminus/masked_steps"] = float(sum(1 for m in out["loss_masks"] if not any(m)))
        rollout_metrics["terminus/hackable_share"] = hackable_share(self.tasks, trajectories)
        return GeneratorOutput(
            prompt_token_ids=out["prompt_token_ids"],
            response_ids=out["response_ids"],
            rewards=out["rewards"],
            loss_masks=out["loss_masks"],
            stop_reasons=out["stop_reasons"],
            rollout_metrics=rollout_metrics,
            rollout_logprobs=out["rollout_logprobs"] if logprobs_complete else None,
            trajectory_ids=out["trajectory_ids"],
            is_last_step=out["is_last_step"],
        )


def _placeholder(trajectory: Trajectory, pad: int) -> StepRow:
    """One masked, zero-reward row for a rollout that produced no token (its sandbox never started)."""
    return StepRow(
        rollout_id=trajectory.rollout_id,
        group_id=trajectory.group_id,
        task=trajectory.task,
        turn=0,
        prompt_ids=[pad],
        response_ids=[pad],
        loss_mask=[0],
        logprobs=[0.0],
        reward=0.0,
        is_last_step=True,
        stop_reason="no_episode",
        masked=True,
        mask_reason="no_episode",
    )


class TerminusTextEnv(BaseTextEnv):
    """A terminal task as a ``skyrl_gym`` text env: ``init`` resets, ``step(reply)`` plays one turn.

    ``extras["task"]`` names the task (a shipped task's name or a folder); ``env_config`` may hold
    the env's keyword arguments (``mode``, ``max_turns``, ...). The reward comes on the last step.
    """

    def __init__(self, env_config: Mapping[str, Any] | None = None, extras: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        config = dict(env_config or {})
        extras = dict(extras or {})
        if "task" not in extras:
            raise ValueError('TerminusTextEnv needs extras={"task": NAME_OR_FOLDER}: set it in the env_extras')
        task = extras["task"] if isinstance(extras["task"], Task) else find_task(extras["task"])
        self.max_turns = int(config.get("max_turns") or 1 << 30)
        self.env = TerminusEnv(task, **{"mode": "train", **config})
        self.info: dict[str, Any] = {}

    def init(self, prompt: list[dict[str, str]]) -> tuple[list[dict[str, str]], dict[str, Any]]:
        """The task's own first observation replaces the dataset's prompt (which only named the task)."""
        obs, info = self.env.reset()
        return [{"role": "user", "content": obs}], {"task": info["task"]}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        obs, reward, terminated, truncated, info = self.env.step(action)
        done = terminated or truncated
        self.info = info
        return BaseTextEnvStepOutput(
            observations=[] if done else [{"role": "user", "content": obs}],
            reward=float(reward),
            done=done,
            metadata={
                "end_reason": info.get("end_reason"),
                "env_error": info.get("masked", False),  # what this adapter's group masking reads
                "format_error": info["format_error"],
            },
        )

    def close(self) -> None:
        self.env.close()

    def get_metrics(self) -> dict[str, Any]:
        episode = self.info.get("episode") or {}
        return {
            "format_errors": episode.get("format_errors", 0),
            "opening_streak": episode.get("format_error_opening_streak", 0),
            "env_error": float(episode.get("masked", False)),
        }


def register() -> None:
    """Register ``TerminusTextEnv`` in ``skyrl_gym`` as ``terminus`` (a second call does nothing)."""
    if ENV_ID not in skyrl_gym.envs.registration.registry:
        skyrl_gym.register(id=ENV_ID, entry_point="terminus_env.integrations.skyrl:TerminusTextEnv")
