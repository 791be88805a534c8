"""GRPO with TRL on terminal tasks: rollouts from real vLLM replicas through the ServingPool, weights synced every step.

On a CPU, with a tiny random model made on the spot (its replies are noise, so every reward is 0 and only weight
decay moves the weights; CI runs this against its own replicas with ``--base-url``):

    python examples/train_grpo.py --tiny --steps 2 --learning-rate 0.05 --weight-decay 1.0

On GPUs, see docs/integrations.md ("GRPO on GPUs") for the model, DP, TP, batch and group sizes to pass:

    python examples/train_grpo.py --model Qwen/Qwen3-8B --dp 4 --replica-gpus 4,5,6,7 --steps 100 \\
        --batch-size 64 --group-size 8 --max-turn-tokens 4096

The script starts the replicas itself (``terminus-env serve --weight-sync``) unless given ``--base-url``s of replicas
already serving the same model with ``--weight-sync``. Each step: the episodes run in Docker sandboxes (the env's
metrics go to the trainer's log as ``env/...``), TRL takes one optimizer step, then the new weights are saved and
loaded into every replica. At the end it prints each step's time split into rollout, training and weight sync, and
with ``--json FILE`` writes the numbers and the trainer's log.

Each step's batch of episodes (mean reward, how they ended, format errors, turns, tokens, tampered and masked
rollouts) goes to ``OUTPUT/steps.jsonl`` as it is played; the run's page, with a chart of each, is then

    terminus-env view OUTPUT/steps.jsonl      # writes OUTPUT/steps.html and OUTPUT/steps.summary.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

STEP_LOG = "steps.jsonl"
"""In ``--output``: a line per step, for ``terminus-env view``'s training-run page."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--model", help="a model folder or Hugging Face name (the trainer and the replicas load it)")
    model.add_argument("--tiny", action="store_true", help="make a tiny random Qwen2 (CPU-sized) and train that")
    parser.add_argument("--tasks", nargs="*", default=["hello-world", "csv-to-json"],
                        help="tasks: names of the shipped suite, or task folders (your own)")  # fmt: skip
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4, help="rollouts per step (a multiple of --group-size)")
    parser.add_argument("--group-size", type=int, default=2, help="rollouts per task in a GRPO group")
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--max-turn-tokens", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--dp", type=int, default=2, help="vLLM replicas to start")
    parser.add_argument("--tp", type=int, default=1, help="GPUs per replica")
    parser.add_argument("--replica-gpus", help="CUDA_VISIBLE_DEVICES for the replicas (the trainer keeps the rest)")
    parser.add_argument("--port", type=int, help="the first replica's port (default: the first of --dp free ones)")
    parser.add_argument("--base-url", action="append", help="use these replicas instead of starting them")
    parser.add_argument("--served-model-name", help="the name the replicas serve the model under")
    parser.add_argument("--max-sandboxes", type=int, default=4)
    parser.add_argument("--output", type=Path, help="checkpoints, logs, steps.jsonl (default: a temporary folder)")
    parser.add_argument("--json", type=Path, help="write the step timings and the trainer's log here")
    return parser.parse_args(argv)


@contextlib.contextmanager
def replicas(args: argparse.Namespace, model: str, log_dir: Path) -> Iterator[tuple[list[str], str]]:
    """The replicas' URLs and served model name: given, or started with ``terminus-env serve --weight-sync``."""
    if args.base_url:
        yield args.base_url, args.served_model_name or model
        return
    from terminus_env.serving.serve_process import ServeProcess, free_ports

    name = args.served_model_name or "policy"
    port = args.port or free_ports(args.dp)
    serve_args = ["--model", model, "--dp", str(args.dp), "--tp", str(args.tp), "--port", str(port), "--host",
                  "127.0.0.1", "--weight-sync", "--", "--served-model-name", name]  # fmt: skip
    if args.tiny:
        serve_args += ["--enforce-eager", "--dtype", "float32", "--max-model-len", "8192"]
    env = {"CUDA_VISIBLE_DEVICES": args.replica_gpus} if args.replica_gpus else {}
    with ServeProcess(serve_args, log_dir, env) as served:
        print("\n".join(served.lines), flush=True)
        yield served.urls, name


class StepTimer:
    """Each optimizer step's wall time, from TRL's step callbacks (rollouts happen inside the step)."""

    def __init__(self) -> None:
        from transformers import TrainerCallback

        timer = self

        class Callback(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001
                timer.started = time.perf_counter()

            def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001
                timer.steps.append(time.perf_counter() - timer.started)

        self.started = 0.0
        self.steps: list[float] = []
        self.callback = Callback()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.batch_size % args.group_size:
        raise SystemExit("--batch-size must be a multiple of --group-size")
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from terminus_env.integrations.trl import WeightSyncCallback, env_reward, make_rollout_func
    from terminus_env.tasks import find_task

    output = args.output or Path(tempfile.mkdtemp(prefix="train-grpo-"))
    output.mkdir(parents=True, exist_ok=True)
    model_path = args.model
    if args.tiny:
        from terminus_env.cli.tiny_model import save_tiny_model

        model_path = str(save_tiny_model(output / "tiny-initial"))
    tasks = [find_task(name) for name in args.tasks]
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    on_gpu = torch.cuda.is_available()
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16 if on_gpu else torch.float32)

    with replicas(args, model_path, output / "replica-logs") as (urls, served):
        rollouts = make_rollout_func(
            tasks, base_urls=urls, model=served, max_tokens=args.max_turn_tokens, max_sandboxes=args.max_sandboxes,
            env_kwargs={"max_turns": args.max_turns}, sampling={"temperature": 1.0}, step_log=output / STEP_LOG,
        )  # fmt: skip
        config = GRPOConfig(
            output_dir=str(output / "trainer"),
            per_device_train_batch_size=args.batch_size,
            num_generations=args.group_size,
            max_steps=args.steps,
            learning_rate=args.learning_rate,
            weight_decay=args.weight_decay,
            use_cpu=not on_gpu,
            bf16=on_gpu,
            report_to=[],
            logging_steps=1,
            save_strategy="no",
            beta=0.0,
            max_completion_length=args.max_turns * (args.max_turn_tokens + 2048),
        )
        # One row per GRPO group: a task's name (TRL repeats each row group_size times for the rollout function).
        groups = args.steps * args.batch_size // args.group_size
        dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": tasks[i % len(tasks)].name}]
                                                for i in range(groups)]})  # fmt: skip
        trainer = GRPOTrainer(model=model, reward_funcs=[env_reward], args=config, train_dataset=dataset,
                              processing_class=tokenizer, rollout_func=rollouts)  # fmt: skip
        sync = WeightSyncCallback(trainer, rollouts, output / "checkpoints")
        timer = StepTimer()
        trainer.add_callback(sync)
        trainer.add_callback(timer.callback)  # after the sync: a step's time includes it
        try:
            trainer.train()
        finally:
            rollouts.close()

    logs = [entry for entry in trainer.state.log_history if "time/rollout_s" in entry]
    rows = []
    for (step, sync_s, report), total, log in zip(sync.syncs, timer.steps, logs):
        rollout_s = log["time/rollout_s"]
        rows.append({"step": step, "total_s": total, "rollout_s": rollout_s, "sync_s": sync_s,
                     "training_s": total - rollout_s - sync_s, "version": report.version,
                     "replicas": list(report.replicas), "load_s": report.load_s, "held_s": report.held_s})  # fmt: skip
    print(f"{'step':>4} {'total s':>8} {'rollout s':>10} {'training s':>11} {'sync s':>7}  reward  env/mean_turns")
    for row, log in zip(rows, logs):
        print(f"{row['step']:>4} {row['total_s']:>8.2f} {row['rollout_s']:>10.2f} {row['training_s']:>11.2f} "
              f"{row['sync_s']:>7.3f}  {log['reward']:.3f}   {log['env/mean_turns']:.2f}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"steps": rows, "log_history": trainer.state.log_history}, indent=1))
    print(f"each step's episodes: {output / STEP_LOG}; their page: terminus-env view {output / STEP_LOG}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
