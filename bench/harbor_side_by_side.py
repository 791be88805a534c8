"""Harbor 0.26's own Terminus 2 agent and ``terminus-env eval``, side by side on the same policy and the same tasks.

The policy is a served "model" both harnesses talk to over HTTP: a simulated vLLM replica whose replies come from
:class:`terminus_env.rollout.served_oracle.FlakyOracleReplies` (the task's reference solution with the flaky
oracle's odds, a careless opening in one episode of three, the task recognised from the conversation). Each harness
gets a fresh replica with the same seed, so the k-th episode of a task draws the same in both. One task also probes
its terminal for a while (large outputs), so its conversation overflows a small context: it is run as well with the
proactive summary off (``proactive_summarization_threshold=0``), so the reactive path runs in both.

The tasks are copies of shipped and compatibility tasks with ``allow_internet = true``, because Harbor's docker
environment refuses a task without network; both harnesses run the same copies. Per harness it reports the score
with its 95% interval (the leaderboard's estimator, ``terminus_env.records.stats``), and per task the mean reward,
turns per trial, end reasons, ``task_complete`` confirmations and summarizations; with the machine's load.

Needs ``.venv-harbor`` (``pip install 'terminus-env[harbor]'``, Python >= 3.12), Docker and Compose v2
(``scripts/ensure-compose.sh``)::

    .venv-harbor/bin/python bench/harbor_side_by_side.py            # 13 tasks x 4 trials, and the overflow runs
    .venv-harbor/bin/python bench/harbor_side_by_side.py --quick    # 3 tasks x 2 trials (CI: tests/adapters)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from terminus_env.records import stats
from terminus_env.records.run_log import read_run
from terminus_env.rollout.served_oracle import FlakyOracleReplies
from terminus_env.sandbox.images import prune_task_images
from terminus_env.serving.sim.engine import SimConfig
from terminus_env.serving.sim.server import ServerConfig, SimServer
from terminus_env.tasks import load_task, shipped_tasks_dir

ROOT = Path(__file__).resolve().parent.parent
COMPAT = ROOT / "tests" / "compat"
TASKS = ["hello-world", "csv-to-json", "fix-permissions", "list-bash-users", "find-large-files", "dotenv-settings",
         "shipped-order-ids", "sqlite-count-customers", "restore-site-backup", "top-error-ips"]  # fmt: skip
COMPAT_TASKS = ["compose-sidecar", "entrypoint-service", "compose-yml-data"]
QUICK_TASKS = ["hello-world", "compose-sidecar", "find-large-files"]
OVERFLOW_TASK = "find-large-files"
PROBES = 8
"""Probing turns of the overflow task: about 2,000 tokens each, so a 16,384-token context overflows twice."""
CONTEXT = 16384
"""The replica's context: the threshold of 8,000 free tokens stays below half of it, as on a large model."""
SEED = 7
MODEL = "sim"
HARBOR_ENV = {"OPENAI_API_KEY": "dummy", "HOSTED_VLLM_API_KEY": "dummy"}


@dataclass(frozen=True)
class TrialRow:
    """One trial, as both harnesses' outputs give it."""

    task: str
    reward: float | None
    """None: the trial raised (no valid reward)."""
    turns: int
    end: str
    confirmations: int
    """Replies that marked the task complete (two when the completion was confirmed)."""
    summarizations: int
    format_errors: int = 0


@dataclass
class Side:
    name: str
    trials: list[TrialRow] = field(default_factory=list)
    wall_s: float = 0.0
    load: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def report(self) -> stats.Report:
        rows = [stats.Trial(t.task, t.reward or 0.0, t.end, valid=t.reward is not None) for t in self.trials]
        return stats.report(rows, max(1, _trials_per_task(self.trials)))


def prepare_suite(names: Sequence[str], dest: Path) -> Path:
    """Copies of the tasks with network allowed (Harbor's docker environment runs no task without)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for name in names:
        source = shipped_tasks_dir() / name if (shipped_tasks_dir() / name).is_dir() else COMPAT / name
        shutil.copytree(source, dest / name)
        toml = dest / name / "task.toml"
        toml.write_text(toml.read_text().replace("allow_internet = false", "allow_internet = true"))
    return dest


class Cl100kChat:
    """The replica's tokenizer: tiktoken's cl100k_base with OpenAI's chat framing (3 tokens per message and 3 to
    open the reply), which is how LiteLLM counts a conversation for a model it does not know. So the replica counts
    tokens as Harbor's Terminus 2 estimates them, and both harnesses see the context fill at the same turn."""

    end_of_turn = ("<|im_end|>", 100265)
    _START, _SEP = 100264, 100266

    def __init__(self) -> None:
        from litellm.litellm_core_utils.default_encoding import encoding  # LiteLLM's own, bundled (offline)

        self._encoding = encoding

    def chat_prompt(self, messages: list[dict]) -> list[int]:
        ids: list[int] = []
        for message in messages:
            content = message.get("content")
            text = content if isinstance(content, str) else json.dumps(content)
            ids += [self._START, *self._encode(str(message.get("role", ""))), self._SEP, *self._encode(text),
                    self.end_of_turn[1]]  # fmt: skip
        return [*ids, self._START, *self._encode("assistant"), self._SEP]

    def reply(self, text: str) -> list[tuple[str, int]]:
        ids = self._encode(text)
        pieces = [self._encoding.decode_single_token_bytes(i) for i in ids]
        return [(piece.decode("utf-8", "replace"), i) for piece, i in zip(pieces, ids, strict=True)]

    def _encode(self, text: str) -> list[int]:
        return self._encoding.encode(text, disallowed_special=())


@contextlib.asynccontextmanager
async def served_policy(suite: Path, probes: dict[str, int]) -> AsyncIterator[str]:
    """A fresh simulated replica serving the flaky oracle for the suite's tasks; yields its URL."""
    tasks = [load_task(path) for path in sorted(suite.iterdir()) if path.is_dir()]
    replies = FlakyOracleReplies(tasks, SEED, probes=probes)
    config = ServerConfig(model=MODEL, time_scale=0.0, engine=SimConfig(max_model_len=CONTEXT))
    async with SimServer(config, replies, tokenizer=Cl100kChat()) as server:
        yield server.url


async def run_harbor(suite: Path, url: str, trials: int, jobs: Path, name: str, concurrency: int,
                     threshold: int | None = None) -> Path:  # fmt: skip
    """Harbor's terminus-2 over the suite; returns its job folder."""
    info = {"max_input_tokens": CONTEXT, "max_output_tokens": CONTEXT, "input_cost_per_token": 0,
            "output_cost_per_token": 0}  # fmt: skip
    command = [str(Path(sys.executable).parent / "harbor"), "run", "-p", str(suite), "-a", "terminus-2",
               "-m", f"hosted_vllm/{MODEL}", "--ak", f"api_base={url}/v1", "--ak", "parser_name=xml",
               "--ak", f"model_info={json.dumps(info)}", "-e", "docker", "-n", str(concurrency), "-k", str(trials),
               "-o", str(jobs), "--job-name", name, "-y", "-q"]  # fmt: skip
    if threshold is not None:
        command += ["--ak", f"proactive_summarization_threshold={threshold}"]
    await _run(command, jobs / f"{name}.log", {**os.environ, **HARBOR_ENV})
    return jobs / name


async def run_ours(suite: Path, url: str, trials: int, out: Path, name: str, concurrency: int,
                   threshold: int | None = None) -> Path:  # fmt: skip
    """``terminus-env eval`` over the suite with its defaults; returns its run file."""
    run_file = out / f"{name}.jsonl"
    command = [sys.executable, "-m", "terminus_env.cli", "eval", str(suite), "--base-url", url, "--model", MODEL,
               "--trials", str(trials), "--concurrency", str(concurrency), "--run-file", str(run_file),
               "--jobs-dir", str(out / "jobs")]  # fmt: skip
    if threshold is not None:
        command += ["--summarize-threshold", str(threshold)]
    await _run(command, out / f"{name}.log", dict(os.environ), ok=(0, 1))
    return run_file


async def _run(command: list[str], log: Path, env: dict[str, str], ok: tuple[int, ...] = (0,)) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as handle:
        process = await asyncio.create_subprocess_exec(*command, stdout=handle, stderr=subprocess.STDOUT, env=env)
        code = await process.wait()
    if code not in ok:
        raise RuntimeError(f"{command[0]} exited {code}; its output is in {log}:\n{log.read_text()[-3000:]}")


def harbor_trials(job: Path) -> list[TrialRow]:
    """Each trial of a Harbor job: reward, agent turns, whether completion was confirmed, summarizations."""
    rows = []
    for result_path in sorted(job.glob("*/result.json")):
        result = json.loads(result_path.read_text())
        trajectory_path = result_path.parent / "agent" / "trajectory.json"
        steps = json.loads(trajectory_path.read_text())["steps"] if trajectory_path.exists() else []
        agent = [s for s in steps if s.get("source") == "agent"]
        marked = [any(c.get("function_name") == "mark_task_complete" for c in s.get("tool_calls") or []) for s in agent]
        errors = sum(1 for s in agent if not s.get("tool_calls") and "parsing errors" in _observed(s))
        exception = result.get("exception_info")
        rewards = (result.get("verifier_result") or {}).get("rewards") or {}
        if exception:
            end = exception["exception_type"]
        else:
            end = "task_complete" if len(marked) >= 2 and marked[-1] and marked[-2] else "other"
        metadata = (result.get("agent_result") or {}).get("metadata") or {}
        reward = rewards.get("reward") if result.get("reward_valid") else None
        rows.append(TrialRow(task=result["task_name"], reward=reward, turns=len(agent), end=end,
                             confirmations=sum(marked), summarizations=int(metadata.get("summarization_count", 0)),
                             format_errors=errors))  # fmt: skip
    return rows


def our_trials(run_file: Path) -> list[TrialRow]:
    rows = []
    for record in read_run(run_file).rollouts:
        trajectory = record.trajectory or {}
        turns = trajectory.get("turns") or []
        confirmations = sum(1 for t in turns if t.get("terminal") is not None and _marks_complete(t.get("reply", "")))
        summary = record.summary or {}
        rows.append(TrialRow(task=record.task, reward=None if record.env_error else record.reward,
                             turns=len(turns), end=record.end_reason, confirmations=confirmations,
                             summarizations=int(summary.get("summarizations", 0)),
                             format_errors=int(summary.get("format_errors", 0))))  # fmt: skip
    return rows


def _marks_complete(reply: str) -> bool:
    from terminus_env.protocol import parse_reply

    return parse_reply(reply).task_complete


def _observed(step: dict[str, Any]) -> str:
    results = (step.get("observation") or {}).get("results") or []
    return " ".join(str(r.get("content") or "") for r in results)


def _trials_per_task(rows: Sequence[TrialRow]) -> int:
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.task] = counts.get(row.task, 0) + 1
    return max(counts.values(), default=1)


async def side_by_side(suite: Path, out: Path, *, trials: int, concurrency: int, probes: dict[str, int],
                       name: str, threshold: int | None = None) -> tuple[Side, Side]:  # fmt: skip
    """Harbor, then terminus-env, each against a fresh replica of the same policy."""
    harbor, ours = Side("Harbor 0.26 terminus-2"), Side("terminus-env eval")
    for side, runner in ((harbor, run_harbor), (ours, run_ours)):
        started = time.monotonic()
        async with served_policy(suite, probes) as url:
            if runner is run_harbor:
                job = await run_harbor(suite, url, trials, out / "harbor", name, concurrency, threshold)
                side.trials = harbor_trials(job)
            else:
                run_file = await run_ours(suite, url, trials, out / "ours", name, concurrency, threshold)
                side.trials = our_trials(run_file)
        side.wall_s = time.monotonic() - started
        side.load = os.getloadavg()
    return harbor, ours


def task_table(harbor: Side, ours: Side) -> list[dict[str, Any]]:
    """Per task and harness: mean reward, turns per trial, end reasons, confirmations, summarizations."""
    rows = []
    for task in sorted({t.task for t in harbor.trials} | {t.task for t in ours.trials}):
        row: dict[str, Any] = {"task": task}
        for key, side in (("harbor", harbor), ("ours", ours)):
            mine = [t for t in side.trials if t.task == task]
            valid = [t.reward for t in mine if t.reward is not None]
            row[key] = {
                "trials": len(mine), "mean": sum(valid) / len(valid) if valid else None,
                "turns": sorted(t.turns for t in mine), "ends": _counts(t.end for t in mine),
                "confirmations": sorted(t.confirmations for t in mine),
                "summarizations": sorted(t.summarizations for t in mine),
                "format_errors": sum(t.format_errors for t in mine),
            }  # fmt: skip
        rows.append(row)
    return rows


def _counts(values: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for value in values:
        out[value] = out.get(value, 0) + 1
    return out


def agree(harbor: Side, ours: Side) -> bool:
    """The two scores' 95% intervals overlap (the same score when neither has an interval)."""
    a, b = harbor.report().overall, ours.report().overall
    if a.ci95 is None or b.ci95 is None:
        return a.mean_reward == b.mean_reward
    return a.ci95[0] <= b.ci95[1] and b.ci95[0] <= a.ci95[1]


def markdown(sections: Sequence[tuple[str, Side, Side]]) -> str:
    """The table docs/evaluation.md shows: per task and harness, then the scores, with the load."""
    lines = ["| run | task | Harbor: mean reward | ours | Harbor: turns per trial | ours | Harbor: confirmed | ours "
             "| Harbor: summarizations | ours |", "|" + " --- |" * 10]  # fmt: skip
    for label, harbor, ours in sections:
        for row in task_table(harbor, ours):
            h, o = row["harbor"], row["ours"]
            lines.append(f"| {label} | {row['task']} | {_mean(h['mean'])} | {_mean(o['mean'])} | "
                         f"{_list(h['turns'])} | {_list(o['turns'])} | {_confirmed(h)} | {_confirmed(o)} | "
                         f"{_list(h['summarizations'])} | {_list(o['summarizations'])} |")  # fmt: skip
        for side in (harbor, ours):
            overall = side.report().overall
            ci = "n/a" if overall.ci95 is None else f"{overall.ci95[0]:.3f}–{overall.ci95[1]:.3f}"
            lines.append(f"| {label} | **score, {side.name}** | {_mean(overall.mean_reward)} (95% CI {ci}) | | | | | "
                         f"| | wall {side.wall_s:.0f} s, load {side.load[0]:.1f} |")  # fmt: skip
    return "\n".join(lines)


def _mean(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _list(values: Sequence[int]) -> str:
    return " ".join(map(str, values))


def _confirmed(side: dict[str, Any]) -> str:
    ends = side["ends"]
    return ", ".join(f"{end} ×{n}" for end, n in sorted(ends.items()))


def harbor_images() -> set[str]:
    """Harbor's task images (``hb__…``), so a run removes those it built."""
    out = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}", "--filter", "reference=hb__*"],
                         capture_output=True, text=True, check=False).stdout  # fmt: skip
    return set(out.split())


def remove_images(names: set[str]) -> None:
    if names:
        subprocess.run(["docker", "rmi", "-f", *sorted(names)], capture_output=True, check=False)


async def main_async(args: argparse.Namespace) -> int:
    out = Path(args.output).resolve()
    out.mkdir(parents=True, exist_ok=True)
    names = QUICK_TASKS if args.quick else [*TASKS, *COMPAT_TASKS]
    trials = args.trials or (2 if args.quick else 4)
    suite = prepare_suite(names, out / "suite")
    probes = {OVERFLOW_TASK: PROBES}
    print(f"side by side: {len(names)} tasks x {trials} trials, seed {SEED}, context {CONTEXT}; "
          f"load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    sections = []
    harbor, ours = await side_by_side(suite, out, trials=trials, concurrency=args.concurrency, probes=probes,
                                      name="defaults")  # fmt: skip
    sections.append(("defaults", harbor, ours))
    overflow = prepare_suite([OVERFLOW_TASK], out / "suite-overflow")
    harbor_r, ours_r = await side_by_side(overflow, out, trials=args.overflow_trials or trials,
                                          concurrency=args.concurrency, probes=probes, name="reactive",
                                          threshold=0)  # fmt: skip
    sections.append(("proactive off", harbor_r, ours_r))
    table = markdown(sections)
    print(table)
    document = {label: {"harbor": [asdict(t) for t in h.trials], "ours": [asdict(t) for t in o.trials],
                        "agree": agree(h, o), "wall_s": [h.wall_s, o.wall_s], "load": [h.load, o.load]}
                for label, h, o in sections}  # fmt: skip
    (out / "results.json").write_text(json.dumps(document, indent=2))
    (out / "table.md").write_text(table + "\n")
    print(f"every trial is in {out}/results.json; the table in {out}/table.md")
    return 0 if all(agree(h, o) for _, h, o in sections) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 tasks x 2 trials (CI)")
    parser.add_argument("--trials", type=int, help="trials per task (default: 4, or 2 with --quick)")
    parser.add_argument("--overflow-trials", type=int, help="trials of the reactive-only run (default: --trials)")
    parser.add_argument("--concurrency", type=int, default=2, help="trials in flight in each harness")
    parser.add_argument("--output", default=str(ROOT / ".bench-cache" / "harbor-side-by-side"))
    args = parser.parse_args(argv)
    before = harbor_images()
    try:
        return asyncio.run(main_async(args))
    finally:  # the task images both harnesses built for the copies
        remove_images(harbor_images() - before)
        out = Path(args.output).resolve()
        prune_task_images({}, [folder for folder in (out / "suite", out / "suite-overflow") if folder.is_dir()])


if __name__ == "__main__":
    sys.exit(main())
