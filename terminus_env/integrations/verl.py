"""verl: ``TerminusAgentLoop``, an agent loop registered as ``terminus``.

verl's agent-loop workers import the class named in the agent-loop YAML, so it lives here, in an
importable module (a class defined in ``__main__`` cannot be imported by verl's workers)::

    # agent_loops.yaml, named by actor_rollout_ref.rollout.agent.agent_loop_config_path
    - name: terminus
      _target_: terminus_env.integrations.verl.TerminusAgentLoop
      tasks_dir: /path/to/tasks        # default: the shipped suite
      mode: train                      # strict format semantics
      max_turns: 30
      mask_time_limits: false          # true: agent_timeout / max_turns train as masked, not graded

Each dataset row names its task in ``extra_info.task`` (or ``task``), or its prompt holds the
task's instruction; set the row's ``agent_name`` to ``terminus``. GRPO groups come from
``rollout.n`` as usual.

Generation is token-in/token-out through verl's ``server_manager.generate``. Each turn's prompt is
built with verl's own Continuous Token builder (the agent loop's ``continuous_token_builder``:
the first prompt rendered, then the model's tokens as generated, then the rendered new messages,
with the template's boundary tokens such as Qwen's newline after ``<|im_end|>``), so no turn
drifts. The output is the merged sequence of :mod:`terminus_env.training`: model tokens mask 1
with their logprobs, the environment's tokens mask 0. An env error, or a rollout whose sandbox
never started, returns reward 0 with an all-zero mask instead of raising (verl gathers a worker's
samples without ``return_exceptions``, so one exception would fail the batch). Masking a whole
GRPO group is not possible here, since each sample runs alone: filter groups in the trainer.

    pip install 'terminus-env[verl]'
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import uuid
from pathlib import Path
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from terminus_env.env import Reply
from terminus_env.errors import TerminusError
from terminus_env.integrations.task_lookup import TaskLookup
from terminus_env.rollout import RolloutRunner
from terminus_env.rollout.policy import PolicyOutput, Rollout
from terminus_env.rollout.trajectory import Trajectory
from terminus_env.tasks import load_tasks
from terminus_env.tasks.loader import shipped_tasks_dir
from terminus_env.training import DriftPolicy, MaskingPolicy, TimeLimitEnds, mask_reason, merge_trajectory

AGENT_NAME = "terminus"


@register(AGENT_NAME)
class TerminusAgentLoop(AgentLoopBase):
    """One terminal-task episode per sample, generated token-in/token-out through verl's server manager."""

    def __init__(
        self,
        *args: Any,
        tasks_dir: str | None = None,
        mode: str = "train",
        max_turns: int | None = None,
        max_turn_tokens: int | None = None,
        mask_time_limits: bool = False,
        audit_report: str | None = None,
        hackable: str = "skip",
        **kwargs: Any,
    ) -> None:
        kwargs.pop("name", None)  # the YAML entry's own name reaches the constructor too
        super().__init__(*args, **kwargs)
        folder = str(Path(tasks_dir).resolve()) if tasks_dir else str(shipped_tasks_dir())
        self.tasks = _task_lookup(folder, str(Path(audit_report).resolve()) if audit_report else None, hackable)
        self.response_length = int(self.rollout_config.response_length)
        self.max_turn_tokens = max_turn_tokens or self.response_length
        self.env_kwargs = {"mode": mode, "max_turns": max_turns, "max_turn_tokens": self.max_turn_tokens}
        self.masking = MaskingPolicy(time_limits=TimeLimitEnds.MASKED if mask_time_limits else TimeLimitEnds.GRADED)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        raw_prompt = list(kwargs.get("raw_prompt") or [])
        task = self.tasks.for_row(kwargs, raw_prompt)
        rollout_id = uuid.uuid4().hex
        rollout = Rollout(rollout_id, str(kwargs.get("uid", rollout_id)), task)
        policy = _ServerManagerPolicy(self, sampling_params, kwargs.get("global_steps"))
        started = time.monotonic()
        trajectory = await RolloutRunner(policy, env_kwargs=self.env_kwargs).run_one(rollout)
        try:
            (sequence,) = merge_trajectory(trajectory, DriftPolicy.RAISE, mask_reason(trajectory, self.masking))
        except TerminusError as exc:  # never raise into verl's gather: this sample trains nothing instead
            trajectory.error = f"{type(exc).__name__}: {exc}"
            return await self._empty(raw_prompt, trajectory, started, policy)
        if not sequence.turns:
            return await self._empty(raw_prompt, trajectory, started, policy)
        n = self.response_length
        logprobs = sequence.response_logprobs
        return AgentLoopOutput(
            prompt_ids=sequence.prompt_ids,
            response_ids=sequence.response_ids[:n],
            response_mask=sequence.response_mask[:n],
            response_logprobs=logprobs[:n] if logprobs is not None else None,
            reward_score=sequence.reward,
            num_turns=len(trajectory.messages),
            metrics=_metrics(started, policy),
            extra_fields={**_extra(trajectory, sequence.mask_reason, truncated=len(sequence.response_ids) > n),
                          "hackable": self.tasks.hackable(task.name)},
        )

    async def _empty(
        self, raw_prompt: list[dict], trajectory: Trajectory, started: float, policy: _ServerManagerPolicy
    ) -> AgentLoopOutput:
        prompt_ids = await self.ct_build_initial_tokens(raw_prompt) if raw_prompt else []
        end = self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None else 0
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=[end],
            response_mask=[0],
            response_logprobs=[0.0],
            reward_score=0.0,
            num_turns=len(trajectory.messages),
            metrics=_metrics(started, policy),
            extra_fields={**_extra(trajectory, "no_tokens", truncated=False),
                          "hackable": self.tasks.hackable(trajectory.task)},
        )


@functools.lru_cache(maxsize=8)
def _task_lookup(folder: str, audit_report: str | None = None, hackable: str = "skip") -> TaskLookup:
    """verl builds one agent loop per sample; the task folder (and an audit report) is read once per worker."""
    return TaskLookup(load_tasks(Path(folder)), audit_report=audit_report, hackable=hackable)


class _ServerManagerPolicy:
    """A policy for one episode: prompts built by verl's Continuous Token builder, tokens from its server manager."""

    def __init__(self, loop: TerminusAgentLoop, sampling_params: dict[str, Any], version: Any) -> None:
        self._loop = loop
        self._sampling = dict(sampling_params)
        self._version = version
        self._ids: list[int] | None = None  # the running token stream: every prompt and completion so far
        self._first_prompt = 0
        self._seen: list[dict] = []
        self.generate_s = 0.0

    def session(self, rollout: Rollout) -> contextlib.AbstractAsyncContextManager[None]:
        return contextlib.nullcontext()

    async def act(self, rollout: Rollout, messages: list[dict[str, str]]) -> PolicyOutput:
        builder = self._loop.continuous_token_builder
        if self._ids is None:
            prompt_ids = await self._loop.ct_build_initial_tokens(messages)
            self._first_prompt = len(prompt_ids)
        else:
            merged = await asyncio.get_running_loop().run_in_executor(
                None, lambda: builder.merge_context_tokens(self._seen, messages, self._ids)
            )
            prompt_ids = merged.token_ids
        budget = min(self._loop.max_turn_tokens, self._loop.response_length - (len(prompt_ids) - self._first_prompt))
        sampling = {**self._sampling, "max_tokens": budget}
        if budget <= 0:  # the response budget is spent: the env ends the episode at its context limit
            return PolicyOutput(reply=Reply("", finish_reason="context_length"), sampling=sampling)
        started = time.monotonic()
        manager = self._loop.server_manager
        out = await manager.generate(rollout.rollout_id, prompt_ids=prompt_ids, sampling_params=sampling)
        self.generate_s += time.monotonic() - started
        ids = list(out.token_ids)
        text = self._loop.tokenizer.decode(ids, skip_special_tokens=True)
        self._ids = builder.merge_assistant_tokens(prompt_ids, ids).token_ids
        self._seen = [*messages, {"role": "assistant", "content": text}]
        ended = bool(ids) and ids[-1] in _end_ids(self._loop.tokenizer)
        version = self._version if self._version is not None else out.extra_fields.get("global_steps")
        return PolicyOutput(
            reply=Reply(
                text=text,
                finish_reason="stop" if ended or len(ids) < budget else "length",
                completion_tokens=len(ids),
                prompt_tokens=len(prompt_ids),
            ),
            prompt_token_ids=list(prompt_ids),
            token_ids=ids,
            logprobs=list(out.log_probs) if out.log_probs is not None else None,
            sampling=sampling,
            policy_version=version,
        )


def _end_ids(tokenizer: Any) -> set[int]:
    ends = tokenizer.eos_token_id
    return set(ends) if isinstance(ends, list) else ({ends} if ends is not None else set())


def _metrics(started: float, policy: _ServerManagerPolicy) -> AgentLoopMetrics:
    total = time.monotonic() - started
    return AgentLoopMetrics(generate_sequences=policy.generate_s, tool_calls=max(total - policy.generate_s, 0.0))


def _extra(trajectory: Trajectory, masked: str | None, *, truncated: bool) -> dict[str, Any]:
    summary = trajectory.summary
    return {
        "task": trajectory.task,
        "end_reason": summary.end_reason if summary else "no_episode",
        "masked": masked,
        "format_errors": summary.format_errors if summary else 0,
        "error": trajectory.error,
        "response_truncated": truncated,
    }
