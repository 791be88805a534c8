"""One GRPO run of the experiment, in its own process so that its arm is set the way users set it: by
``SWE_STRICT_FORMAT`` and ``SWE_STRICT_TRUNCATION`` in its environment (unset: the train mode's strict default).

TRL's ``GRPOTrainer`` takes its rollouts from the replicas through ``make_rollout_func`` (the ServingPool), and
``WeightSyncCallback`` loads every step's weights into them. The run first loads the start weights, so every run of
every arm begins from the same model on the same replicas. Every rollout's summary is recorded with its step and
its place in the batch (TRL's groups are consecutive runs of ``group_size``), with the policy's probability of a
broken opening before the step's update (``strict_lab.probe``). Each step is on disk as soon as its rollouts are
(``rollouts.jsonl``, ``steps.jsonl``), so a run stopped early can still be reported (``--report-only``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from strict_lab.probe import broken_opening_probability
from terminus_env.protocol import Strictness


@dataclass(frozen=True)
class RunConfig:
    start: str
    urls: list[str]
    served_model: str
    tasks: list[str]
    first_prompts: list[str]
    steps: int
    group_size: int
    groups_per_step: int
    learning_rate: float
    max_turns: int
    max_turn_tokens: int
    seed: int
    max_sandboxes: int
    warm_sandboxes: int
    """Started ahead per task: the next step's sandboxes start while the trainer trains."""
    output: str


class RecordingRollouts:
    """TRL's ``rollout_func``: the env's rollouts, each one's summary appended to ``rollouts.jsonl``."""

    def __init__(self, rollouts: Any, tokenizer: Any, config: RunConfig) -> None:
        self.rollouts = rollouts
        self._tokenizer = tokenizer
        self._config = config
        self._sink = Path(config.output) / "rollouts.jsonl"
        self._steps_sink = Path(config.output) / "steps.jsonl"
        self.steps: list[dict[str, Any]] = []

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list]:
        step = trainer.state.global_step + 1
        probe = broken_opening_probability(trainer.model, self._tokenizer, self._config.first_prompts)
        batch = self.rollouts(prompts, trainer)
        with self._sink.open("a") as sink:
            for index, trajectory in enumerate(self.rollouts.last_trajectories):
                sink.write(json.dumps(rollout_row(step, index, self._config.group_size, trajectory)) + "\n")
        self.steps.append({"step": step, "p_broken_opening": probe, "rollout_s": self.rollouts.last_rollout_s})
        with self._steps_sink.open("a") as sink:
            sink.write(json.dumps(self.steps[-1]) + "\n")
        return batch


def rollout_row(step: int, index: int, group_size: int, trajectory: Any) -> dict[str, Any]:
    """A rollout's summary with its place in the batch; the keys ``terminus_env.records.metrics.aggregate`` reads
    included."""
    summary = trajectory.summary
    first = trajectory.turns[0] if trajectory.turns else None
    return {
        "step": step,
        "index": index,
        "group": index // group_size,
        "task": trajectory.task,
        "env_error": trajectory.masked,
        "reward": trajectory.reward,
        "end_reason": str(summary.end_reason) if summary else None,
        "turns": summary.turns if summary else 0,
        "format_errors": summary.format_errors if summary else 0,
        "format_error_opening_streak": summary.format_error_opening_streak if summary else 0,
        "truncated_turns": summary.truncated_turns if summary else 0,
        "rescued": bool(summary and summary.rescued),
        "first_turn_rejected": bool(first and first.format_error),
        "first_turn_error": first.format_error if first else None,
        "completion_tokens": sum(t.completion_tokens or 0 for t in trajectory.turns),
        "ready_s": trajectory.ready_s,
        "grade_s": trajectory.grade_s,
        "wall_s": round(trajectory.wall_s, 3),
    }


def run(config: RunConfig) -> dict[str, Any]:
    """Train ``config.steps`` GRPO steps; returns (and writes to ``run.json``) the per-step log."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from terminus_env.integrations.trl import WeightSyncCallback, env_reward, make_rollout_func
    from terminus_env.tasks import find_task

    output = Path(config.output)
    output.mkdir(parents=True, exist_ok=True)
    (output / "rollouts.jsonl").unlink(missing_ok=True)
    (output / "steps.jsonl").unlink(missing_ok=True)
    strictness = Strictness.from_env("train")  # what every env of this run reads from the same variables
    (output / "strictness.json").write_text(json.dumps(asdict(strictness)))
    tasks = [find_task(name) for name in config.tasks]
    tokenizer = AutoTokenizer.from_pretrained(config.start)
    on_gpu = torch.cuda.is_available()
    model = AutoModelForCausalLM.from_pretrained(config.start, dtype=torch.bfloat16 if on_gpu else torch.float32)
    rollouts = make_rollout_func(
        tasks, base_urls=config.urls, model=config.served_model, max_tokens=config.max_turn_tokens,
        max_sandboxes=config.max_sandboxes, warm_sandboxes=config.warm_sandboxes,
        env_kwargs={"max_turns": config.max_turns},
        sampling={"temperature": 1.0},
    )  # fmt: skip
    recorder = RecordingRollouts(rollouts, tokenizer, config)
    batch = config.group_size * config.groups_per_step
    args = GRPOConfig(
        output_dir=str(output / "trainer"), per_device_train_batch_size=batch, num_generations=config.group_size,
        max_steps=config.steps, learning_rate=config.learning_rate, lr_scheduler_type="constant", seed=config.seed,
        use_cpu=not on_gpu, bf16=on_gpu, report_to=[], logging_steps=1, save_strategy="no", beta=0.0,
        max_completion_length=config.max_turns * (config.max_turn_tokens + 2048),
    )  # fmt: skip
    groups = config.steps * config.groups_per_step
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": tasks[i % len(tasks)].name}]
                                            for i in range(groups)]})  # fmt: skip
    trainer = GRPOTrainer(model=model, reward_funcs=[env_reward], args=args, train_dataset=dataset,
                          processing_class=tokenizer, rollout_func=recorder)  # fmt: skip
    sync = WeightSyncCallback(trainer, rollouts, output / "checkpoints")
    trainer.add_callback(sync)
    try:
        rollouts.sync_weights(config.start, version=0)  # the replicas may hold another run's weights
        trainer.train()
    finally:
        rollouts.close()
    logged = [entry for entry in trainer.state.log_history if "env/mean_reward" in entry]
    steps = [
        {**probe, "sync_s": sync_s, "log": log}
        for probe, (_, sync_s, _), log in zip(recorder.steps, sync.syncs, logged)
    ]
    result = {"config": asdict(config), "strictness": asdict(strictness), "steps": steps}
    (output / "run.json").write_text(json.dumps(result, indent=1))
    return result
