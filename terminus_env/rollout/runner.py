"""The vectorized rollout runner: many episodes on one event loop, each talking to its policy.

Concurrency has two bounds: the policy's session (the serving pool's admission control, sized to
KV capacity) and ``max_sandboxes`` (what the machine's CPUs and Docker can hold).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from terminus_env.env import TerminusEnv
from terminus_env.rollout.policy import Policy, Rollout
from terminus_env.rollout.summarize import SummarizeConfig, Summarizer
from terminus_env.rollout.trajectory import Trajectory, TurnRecord
from terminus_env.sandbox import SandboxError, SandboxPool
from terminus_env.serving.client import ServingError
from terminus_env.tasks import Task, TaskError


class RolloutRunner:
    """Runs groups of rollouts: ``group_size`` episodes per task, all concurrently.

    ``summarize`` turns on Terminus 2's context summarization (:mod:`terminus_env.rollout.summarize`), which only
    lenient evaluation envs allow; without it, a conversation that no longer fits ends the episode.
    """

    def __init__(
        self,
        policy: Policy,
        *,
        env_kwargs: Mapping[str, Any] | None = None,
        sandbox_pool: SandboxPool | None = None,
        max_sandboxes: int = 8,
        on_finish: Callable[[Trajectory], None] | None = None,
        summarize: SummarizeConfig | None = None,
    ) -> None:
        if max_sandboxes <= 0:
            raise ValueError(f"max_sandboxes must be positive, got {max_sandboxes}")
        self._policy = policy
        self._env_kwargs = dict(env_kwargs or {})
        self._sandbox_pool = sandbox_pool
        self._sandboxes = asyncio.Semaphore(max_sandboxes)
        self._on_finish = on_finish
        self._summarize = summarize if summarize is not None and summarize.enabled else None

    async def run(self, tasks: Sequence[Task], group_size: int = 1) -> list[Trajectory]:
        """One group per task; trajectories come back in task order, then rollout order."""
        if group_size <= 0:
            raise ValueError(f"group_size must be positive, got {group_size}")
        rollouts = [
            Rollout(rollout_id=f"{group_id}-{i}", group_id=group_id, task=task)
            for task in tasks
            for group_id in [f"{task.name}-{uuid.uuid4().hex[:8]}"]
            for i in range(group_size)
        ]
        return list(await asyncio.gather(*(self.run_one(r) for r in rollouts)))

    async def run_one(self, rollout: Rollout) -> Trajectory:
        """Play one episode to its end; never raises for sandbox, task or serving failures (they become env errors:
        a replica whose engine died with this rollout's request in it fails this rollout, not the run)."""
        trajectory = Trajectory(rollout_id=rollout.rollout_id, task=rollout.task.name, group_id=rollout.group_id)
        started = time.monotonic()
        trajectory.started_at = time.time()
        async with self._policy.session(rollout), self._sandboxes:
            env = TerminusEnv(rollout.task, sandbox_pool=self._sandbox_pool,
                              **{"summarized": self._summarize is not None, **self._env_kwargs})
            try:
                await self._play(env, rollout, trajectory, started)
            except (SandboxError, TaskError, ServingError) as exc:
                trajectory.error = f"{type(exc).__name__}: {exc}"
            finally:
                await env.aclose()
            timings = env.metrics()
            trajectory.grade_s = round(timings["grade_s_max"], 3) if timings["grade_count"] else None
        trajectory.wall_s = time.monotonic() - started
        if self._on_finish is not None:
            self._on_finish(trajectory)
        return trajectory

    async def _play(self, env: TerminusEnv, rollout: Rollout, trajectory: Trajectory, started: float) -> None:
        def since_start() -> float:
            return round(time.monotonic() - started, 3)

        _, reset_info = await env.areset()
        trajectory.ready_s, trajectory.screen = since_start(), reset_info["screen"]
        summarizer = Summarizer(self._policy, self._summarize, since_start) if self._summarize else None
        while True:
            if summarizer is not None:
                await summarizer.before_turn(env, rollout, trajectory)
            out = await self._policy.act(rollout, env.messages)
            if out.reply.finish_reason == "context_length" and summarizer is not None:
                out = await summarizer.after_overflow(env, rollout, trajectory, out)
            replied = since_start()
            _, _, terminated, truncated, info = await env.astep(out.reply)
            trajectory.turns.append(
                TurnRecord(
                    **out.record_fields(),
                    format_error=info["format_error"],
                    warnings=info["warnings"],
                    commands=info["commands"],
                    terminal=info["terminal"],
                    replied_s=replied,
                    observed_s=since_start(),
                )
            )
            if terminated or truncated:
                trajectory.summary = env.episode_summary
                trajectory.messages = env.messages
                trajectory.verifier = info.get("verifier")
                return
