"""TRL: ``GRPOTrainer(rollout_func=make_rollout_func(...), reward_funcs=[env_reward])``.

TRL calls ``rollout_func(prompts, trainer)`` synchronously with the process's prompts, each
repeated ``num_generations`` times in a row (TRL 1.16's ``RepeatSampler``; its docstring says
otherwise, the code does this). Each run of equal prompts is one GRPO group; each prompt names its
task (the task's name, or text holding its instruction). Every episode runs on the process-wide
background loop (:func:`terminus_env.utils.bridge.shared_loop`), where the serving pool and the optional
warm sandbox pool live for the trainer's whole life.

Per rollout TRL gets one merged sequence (:mod:`terminus_env.training`): ``prompt_ids`` is the
first prompt, ``completion_ids`` the completions and the environment's tokens between them,
``env_mask`` 1 on model tokens only, ``logprobs`` the engine's (0.0 between turns). The extra
``env_reward`` field carries the env's reward, ``None`` for a masked rollout: TRL then gives it
advantage 0 and leaves it out of its group's baseline. ``trl vllm-serve`` runs vLLM's own server
(already with ``--logprobs-mode processed_logprobs``), so ``base_urls`` may point at it, as at
``terminus-env serve`` replicas.

TRL syncs weights only into its own ``trl vllm-serve``. With other replicas, add
:class:`WeightSyncCallback`: after every optimizer step it saves the model and loads it into every
replica (:meth:`terminus_env.serving.ServingPool.sync_weights`; start them with ``terminus-env serve
--weight-sync``), so the next rollouts sample from the weights being trained. The trainer's log then
holds ``time/rollout_s`` and ``time/weight_sync_s`` beside the env's metrics.

    pip install 'terminus-env[trl]'
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from terminus_env.integrations.task_lookup import TaskLookup, hackable_share, prompt_text
from terminus_env.records.metrics import aggregate
from terminus_env.records.step_log import StepLog
from terminus_env.rollout import RolloutRunner, ServingPolicy
from terminus_env.rollout.policy import Policy, Rollout
from terminus_env.rollout.trajectory import Trajectory
from terminus_env.sandbox import SandboxPool
from terminus_env.serving.weight_sync import CheckpointReload, WeightSync
from terminus_env.tasks import Task
from terminus_env.training import (
    DEFAULT_MASKING,
    DriftPolicy,
    MaskingPolicy,
    MergedSequence,
    check_vocabulary,
    drift_counts,
    merged_sequences,
    untrained_token_share,
)
from terminus_env.utils.bridge import shared_loop

REWARD_FIELD = "env_reward"


class TerminusRollouts:
    """TRL's ``rollout_func``; call :meth:`close` (or use ``with``) when training ends.

    ``max_tokens`` is the one per-turn limit: the engine cuts each reply there, and the env judges the cut by it
    (``max_turn_tokens``). A ``seed`` in ``sampling`` becomes one per rollout and turn, so a group holds no copies.
    ``step_log`` (a path or a :class:`~terminus_env.records.step_log.StepLog`) records each batch's figures, a line
    per step, for ``terminus-env view``'s training-run page.
    """

    def __init__(
        self,
        tasks: Sequence[Task],
        *,
        base_urls: Sequence[str] | None = None,
        model: str | None = None,
        policy: Policy | None = None,
        env_kwargs: Mapping[str, Any] | None = None,
        max_tokens: int = 4096,
        sampling: Mapping[str, Any] | None = None,
        drift: DriftPolicy = DriftPolicy.REALIGN,
        masking: MaskingPolicy = DEFAULT_MASKING,
        max_sandboxes: int = 8,
        warm_sandboxes: int = 0,
        serving_kwargs: Mapping[str, Any] | None = None,
        step_log: str | Path | StepLog | None = None,
        audit_report: str | Path | None = None,
        hackable: str = "skip",
    ) -> None:
        if drift is DriftPolicy.SPLIT:
            raise ValueError("TRL takes one completion per prompt: use DriftPolicy.REALIGN or DriftPolicy.RAISE")
        if policy is None and not (base_urls and model):
            raise ValueError("give base_urls and model (vLLM servers, e.g. `trl vllm-serve`), or a policy")
        self._tasks = TaskLookup(tasks, audit_report=audit_report, hackable=hackable)
        self._urls = list(base_urls or [])
        self._model = model
        self._policy = policy
        self._env_kwargs = {"mode": "train", **dict(env_kwargs or {})}
        if policy is None:  # one limit: the engine cuts a reply at max_tokens, the env judges and names that cut
            turn_limit = self._env_kwargs.setdefault("max_turn_tokens", max_tokens)
            if turn_limit != max_tokens:
                raise ValueError(
                    f"env_kwargs max_turn_tokens={turn_limit} differs from max_tokens={max_tokens}: the engine cuts "
                    "each reply at max_tokens, which the env judges by max_turn_tokens; pass max_tokens alone"
                )
        self._max_tokens = max_tokens
        self._sampling = dict(sampling or {})
        self._drift = drift
        self._masking = masking
        self._max_sandboxes = max_sandboxes
        self._warm = warm_sandboxes
        self._serving_kwargs = dict(serving_kwargs or {})
        self._step_log = StepLog(step_log) if isinstance(step_log, (str, Path)) else step_log
        self._serving: Any = None
        self._sandboxes: SandboxPool | None = None
        self.last_trajectories: list[Trajectory] = []
        self.last_rollout_s = 0.0

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list]:
        version = getattr(getattr(trainer, "state", None), "global_step", None)
        started = time.perf_counter()
        trajectories = shared_loop().run(self._rollouts(prompts, version))
        self.last_rollout_s = time.perf_counter() - started
        self.last_trajectories = trajectories
        sequences = merged_sequences(trajectories, self._drift, self._masking)
        vocab_size = _vocab_size(trainer)
        if vocab_size is not None:
            check_vocabulary(sequences, vocab_size)
        batch = trl_batch(sequences, _end_token(trainer))
        extra = {"time/rollout_s": self.last_rollout_s, "env/hackable_share": hackable_share(self._tasks, trajectories)}
        _log(trainer, trajectories, sequences, extra)
        if self._step_log is not None:  # the batch of the optimizer step after the trainer's last
            step = version + 1 if isinstance(version, int) else None
            self._step_log.add(trajectories, step=step, masking=self._masking, extra={"rollout_s": self.last_rollout_s})
        return batch

    def sync_weights(self, checkpoint: str | Path, version: Any) -> WeightSync:
        """Load the model saved at ``checkpoint`` into every replica; later turns record ``version``."""
        if self._policy is not None and self._serving is None:
            raise ValueError("sync_weights needs the serving pool: build the rollouts with base_urls and model")
        return shared_loop().run(self._sync(CheckpointReload(str(checkpoint)), version))

    async def _sync(self, source: CheckpointReload, version: Any) -> WeightSync:
        await self._ensure_policy()
        return await self._serving.sync_weights(source, version)

    def close(self) -> None:
        """Close the serving and sandbox pools (on the loop they live on)."""
        shared_loop().run(self._aclose())

    def __enter__(self) -> TerminusRollouts:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def _rollouts(self, prompts: list[Any], version: Any) -> list[Trajectory]:
        policy = await self._ensure_policy()
        if isinstance(policy, ServingPolicy):
            # Weights synced through the pool are named by the pool (what the replicas hold); else by the step.
            synced = self._serving is not None and self._serving.policy_version is not None
            policy.policy_version = None if synced else version
        runner = RolloutRunner(
            policy, env_kwargs=self._env_kwargs, sandbox_pool=self._sandboxes, max_sandboxes=self._max_sandboxes
        )
        rollouts = []
        for _, grouped in itertools.groupby(enumerate(prompts), key=lambda item: prompt_text(item[1])):
            run = list(grouped)
            task = self._tasks.for_prompt(run[0][1])
            group_id = f"{task.name}-{uuid.uuid4().hex[:8]}"
            rollouts += [Rollout(f"{group_id}-{i}", group_id, task) for i in range(len(run))]
        return list(await asyncio.gather(*(runner.run_one(r) for r in rollouts)))

    async def _ensure_policy(self) -> Policy:
        if self._warm and self._sandboxes is None:
            self._sandboxes = SandboxPool(warm_per_spec=self._warm)
        if self._policy is None:
            from terminus_env.serving import ServingPool

            self._serving = ServingPool(self._urls, str(self._model), **self._serving_kwargs)
            await self._serving.start()
            self._policy = ServingPolicy(self._serving, max_tokens=self._max_tokens, sampling=self._sampling)
        return self._policy

    async def _aclose(self) -> None:
        if self._serving is not None:
            await self._serving.aclose()
            self._serving, self._policy = None, None
        if self._sandboxes is not None:
            await self._sandboxes.aclose()
            self._sandboxes = None


class WeightSyncCallback(TrainerCallback):
    """After each optimizer step: save the model to ``checkpoint_dir/step-N`` and load it into every replica.

    ``trainer.add_callback(WeightSyncCallback(trainer, rollouts, "checkpoints"))``. The replicas then
    serve the weights of step N, and the next rollouts record ``policy_version`` N. Each sync's time,
    the save included, is logged as ``time/weight_sync_s`` and kept in ``syncs``. Only the newest
    ``keep`` step folders stay on disk (the replicas read the last one).
    """

    def __init__(self, trainer: Any, rollouts: TerminusRollouts, checkpoint_dir: str | Path, keep: int = 1) -> None:
        self._trainer = trainer
        self._rollouts = rollouts
        self._dir = Path(checkpoint_dir)
        self._keep = keep
        self.syncs: list[tuple[int, float, WeightSync]] = []  # (step, seconds with the save, the pool's report)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        started = time.perf_counter()
        path = self._dir / f"step-{state.global_step}"
        self._trainer.model.save_pretrained(path)
        report = self._rollouts.sync_weights(path, state.global_step)
        seconds = time.perf_counter() - started
        self.syncs.append((state.global_step, seconds, report))
        store = getattr(self._trainer, "_metrics", None)
        if isinstance(store, Mapping) and "train" in store:  # logged with this step's metrics
            store["train"]["time/weight_sync_s"].append(seconds)
        for old in sorted(self._dir.glob("step-*"), key=lambda p: int(p.name[5:]))[: -self._keep]:
            shutil.rmtree(old)


def make_rollout_func(tasks: Sequence[Task], **kwargs: Any) -> TerminusRollouts:
    """A ``rollout_func`` for ``GRPOTrainer``; ``kwargs`` as :class:`TerminusRollouts`."""
    return TerminusRollouts(tasks, **kwargs)


def trl_batch(sequences: Sequence[MergedSequence], end_token: int) -> dict[str, list]:
    """What ``rollout_func`` returns for merged sequences, one per prompt.

    A rollout with no model token (its sandbox never started) gets one ``end_token``, masked, so
    that TRL's tensors keep one row per prompt.
    """
    prompt_ids, completion_ids, logprobs, env_mask = [], [], [], []
    for s in sequences:
        response = s.response_ids or [end_token]
        prompt_ids.append(list(s.prompt_ids) or [end_token])
        completion_ids.append(list(response))
        env_mask.append(list(s.response_mask) if s.response_ids else [0])
        logprobs.append(list(s.response_logprobs) if s.response_logprobs is not None else [0.0] * len(response))
    return {
        "prompt_ids": prompt_ids,
        "completion_ids": completion_ids,
        "logprobs": logprobs,
        "env_mask": env_mask,
        REWARD_FIELD: [None if s.masked else s.reward for s in sequences],
        "end_reason": [s.end_reason or s.mask_reason for s in sequences],  # the env's (format_error, ...)
        "finish_reason": [s.stop_reason for s in sequences],  # the engine's, of the last turn
        "task": [s.task for s in sequences],
        "drifted_turns": [s.drifted_turns for s in sequences],
    }


def env_reward(completions: list[Any], **kwargs: Any) -> list[float | None]:
    """TRL reward function: the env's reward from the rollout, ``None`` where the rollout is masked."""
    rewards = kwargs.get(REWARD_FIELD)
    if rewards is None:
        raise KeyError(f"no {REWARD_FIELD!r} field: use env_reward with a rollout_func from make_rollout_func")
    return list(rewards)


def _end_token(trainer: Any) -> int:
    tokenizer = getattr(trainer, "processing_class", None)
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor wraps its tokenizer
    for name in ("eos_token_id", "pad_token_id"):
        token = getattr(tokenizer, name, None)
        if isinstance(token, int):
            return token
    return 0


def _vocab_size(trainer: Any) -> int | None:
    """The trainer's model's embedding rows (``config.vocab_size``), when it has a model."""
    size = getattr(getattr(getattr(trainer, "model", None), "config", None), "vocab_size", None)
    return size if isinstance(size, int) else None


def _log(trainer: Any, trajectories: list[Trajectory], sequences: list[MergedSequence], extra: dict) -> None:
    """Our batch metrics into TRL's logs (``env/...``), when the trainer exposes its metrics store."""
    store = getattr(trainer, "_metrics", None)
    if not isinstance(store, Mapping) or "train" not in store:
        return
    metrics = aggregate([t for t in trajectories if t.summary is not None], drift=drift_counts(sequences))
    for name in ("mean_reward", "mean_format_errors", "mean_opening_streak", "rescued_rate", "mean_turns"):
        store["train"][f"env/{name}"].append(float(getattr(metrics, name)))
    store["train"]["env/drifted_turns"].append(float(metrics.drifted_turns))
    # Under REALIGN a drifted turn's earlier completions stop training silently; this says how much.
    store["train"]["env/untrained_token_share"].append(untrained_token_share(trajectories, sequences))
    for name, value in extra.items():
        store["train"][name].append(float(value))
    store["train"]["env/masked"].append(float(sum(s.masked for s in sequences)))
