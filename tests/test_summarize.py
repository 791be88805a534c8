"""Context summarization, as Terminus 2 does it: the rules, then real episodes (Docker sandboxes, a simulated replica
over real HTTP) whose conversation overflows a small context and carries on, proactively and reactively; strict mode
never summarizes, and a trainer is never handed a summarized rollout as one token sequence."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

import pytest

from terminus_env import TerminusEnv, load_task
from terminus_env.cli.evaluate import rollout_record
from terminus_env.records.atif import AgentSpec, atif_trajectory, subagent_trajectories
from terminus_env.rollout import RolloutRunner, ServingPolicy
from terminus_env.rollout.served_oracle import FlakyOracleReplies
from terminus_env.rollout.summarize import (
    SummarizeConfig,
    effective_threshold,
    proactive_due,
    unwind_point,
)
from terminus_env.rollout.trajectory import TurnRecord
from terminus_env.serving import ServingPool
from terminus_env.serving.sim.engine import SimConfig
from terminus_env.serving.sim.server import ServerConfig, SimServer
from terminus_env.training import TrainingDataError, merged_sequences, step_rows

WINDOW = 8192
PROBES = 4


def turn(prompt: int, completion: int) -> TurnRecord:
    return TurnRecord(reply="r", finish_reason="stop", prompt_tokens=prompt, completion_tokens=completion)


def test_the_threshold_is_terminus_2s_on_a_large_context_and_at_most_half_a_small_one() -> None:
    assert effective_threshold(8000, 131072) == 8000 and effective_threshold(8000, 4096) == 2048
    config = SummarizeConfig(context_window=16384)
    assert proactive_due(config, 8000) is None  # 8,384 free: not yet
    assert proactive_due(config, 8400) == 7984
    assert proactive_due(dataclasses.replace(config, threshold=0), 16000) is None  # proactive off
    assert proactive_due(dataclasses.replace(config, enabled=False), 16000) is None
    assert proactive_due(SummarizeConfig(), 10**9) is None  # the context is unknown: only the reactive path
    assert proactive_due(config, None) is None  # no token counts (a local policy)
    with pytest.raises(ValueError, match="at least 0"):
        SummarizeConfig(threshold=-1)


def test_a_reactive_summary_drops_the_latest_exchanges_until_enough_is_free() -> None:
    # One first message, then per turn a reply and an observation; the turns' counts end at each reply.
    turns = [turn(1000, 100), turn(3000, 100), turn(6000, 100), turn(9000, 100)]
    assert unwind_point(turns, 1, 10000, 4000) == 1 + 2 * 1 + 1  # the third reply leaves 3,900 free: dropped too
    assert unwind_point(turns, 1, 10100, 4000) == 1 + 2 * 2 + 1  # 6,100 used, 4,000 free: the third reply kept
    assert unwind_point(turns, 1, 5100, 4000) == 1 + 1  # only the first reply fits
    assert unwind_point(turns, 1, 4000, 4000) == 1  # nothing fits: the first message alone
    assert unwind_point(turns, 4, 100000, 4000) == 4 + 2 * 3 + 1  # all fits: everything but the last observation
    assert unwind_point(turns, 4, 4000, 4000) == 1  # after a summary too: the task's message alone, not the summary
    assert unwind_point(turns, 1, None, 4000) == 1 + 2 * 3 + 1  # unknown context: nothing dropped, as Terminus 2


@pytest.fixture(scope="module")
def task(tiny_task_dir):
    return load_task(tiny_task_dir)


def replies_that_solve(task) -> FlakyOracleReplies:
    """The served oracle with a seed whose first episode probes, applies the solution and completes."""
    for seed in range(200):
        replies = FlakyOracleReplies([task], seed, probes={task.name: PROBES}, command_duration=5.0)
        if replies.plan(task, 0) == [*["probe"] * PROBES, "solve", "complete"]:
            return replies
    raise AssertionError("no seed in 0..199 draws a solving episode")


@contextlib.asynccontextmanager
async def served(replies):
    config = ServerConfig(model="sim", time_scale=0.0, engine=SimConfig(max_model_len=WINDOW))
    async with SimServer(config, replies) as server, ServingPool([server.url], "sim") as pool:
        yield pool


def play(task, *, mode: str = "eval", threshold: int = 8000):
    async def main():
        async with served(replies_that_solve(task)) as pool:
            runner = RolloutRunner(ServingPolicy(pool, max_tokens=1024), env_kwargs={"mode": mode},
                                   summarize=SummarizeConfig(threshold=threshold, context_window=WINDOW))  # fmt: skip
            (trajectory,) = await runner.run([task])
            return trajectory

    return asyncio.run(main())


@pytest.fixture(scope="module")
def proactive(task, docker_required):
    return play(task)


def test_a_proactive_summary_carries_the_episode_on_to_its_end(task, proactive) -> None:
    assert proactive.summary.end_reason == "task_complete" and proactive.reward == 1.0
    assert len(proactive.turns) == PROBES + 3  # the plan and the confirmation: no turn lost or added
    done = [c for c in proactive.compactions if c.outcome == "summary"]
    assert done and proactive.summary.summarizations == len(done) and proactive.summarized
    first = done[0]
    assert first.trigger == "proactive" and 0 < first.free_tokens < effective_threshold(8000, WINDOW)
    assert [c.role for c in first.calls] == ["summary", "questions", "answers"]
    assert all(c.finish_reason == "stop" and c.token_ids and c.prompt_tokens for c in first.calls)
    assert first.kept == len(first.replaced) - 1  # a proactive summary asks from the whole conversation
    assert first.seed[0] == first.replaced[0]  # the task's first message stays
    assert first.seed[1]["content"] == first.calls[1].prompt and first.seed[2]["content"] == first.calls[1].reply
    assert first.calls[2].reply in first.seed[3]["content"]  # the answers, in the message answered next
    assert first.calls[0].prompt_tokens > WINDOW - effective_threshold(8000, WINDOW)  # it saw all of it


def test_the_job_folder_records_it_as_harbor_does(task, proactive) -> None:
    record = rollout_record(task, 0, proactive)
    agent = AgentSpec(model_name="sim")
    document = atif_trajectory(record, agent)
    steps = document["steps"]
    systems = [s for s in steps if s["source"] == "system"]
    assert len(systems) == proactive.summary.summarizations
    refs = systems[0]["observation"]["results"][0]["subagent_trajectory_ref"]
    files = subagent_trajectories(record, agent)
    assert [r["trajectory_path"] for r in refs] == [f"trajectory.summarization-1-{role}.json"
                                                  for role in ("summary", "questions", "answers")]  # fmt: skip
    assert set(files) >= {r["trajectory_path"] for r in refs}
    after = steps[steps.index(systems[0]) + 1]
    assert after["source"] == "user" and after["message"] == proactive.compactions[0].seed[-1]["content"]
    assert [s["step_id"] for s in steps] == list(range(1, len(steps) + 1))
    assert sum(1 for s in steps if s["source"] == "agent") == len(proactive.turns)
    summary = files["trajectory.summarization-1-summary.json"]["steps"]
    assert all(s["is_copied_context"] for s in summary[:-2]) and summary[-1]["source"] == "agent"
    assert len(summary) == proactive.compactions[0].kept + 2
    questions = files["trajectory.summarization-1-questions.json"]["steps"]
    assert len(questions) == 2  # a fresh context: the request and the answer


def test_training_refuses_a_summarized_rollout_as_one_sequence(proactive) -> None:
    with pytest.raises(TrainingDataError, match="summarized"):
        merged_sequences([proactive])
    assert len(step_rows([proactive])) == len(proactive.turns)  # each request's own tokens stay usable


@pytest.mark.usefixtures("docker_required")
def test_a_reactive_summary_unwinds_then_carries_on(task) -> None:
    trajectory = play(task, threshold=0)
    assert trajectory.summary.end_reason == "task_complete" and trajectory.reward == 1.0
    (first, *_) = [c for c in trajectory.compactions if c.outcome != "failed"]
    assert first.trigger == "reactive" and first.outcome == "summary"
    assert first.kept < len(first.replaced) - 1  # the latest exchange(s) dropped before asking
    assert len(trajectory.turns) >= PROBES + 3  # what was dropped is played again


@pytest.mark.usefixtures("docker_required")
def test_strict_mode_never_summarizes(task) -> None:
    trajectory = play(task, mode="train", threshold=0)
    assert trajectory.summary.end_reason == "context_limit" and trajectory.reward == 0.0
    assert trajectory.compactions == [] and trajectory.summary.summarizations == 0


def test_the_env_refuses_to_summarize_outside_lenient_evaluation(task) -> None:
    for env in (TerminusEnv(task, mode="train"), TerminusEnv(task, mode="eval", strict_format=True)):
        assert not env.summarizes
    assert TerminusEnv(task, mode="eval").summarizes
    with pytest.raises(RuntimeError, match="no episode runs"):
        TerminusEnv(task, mode="eval").compact([{"role": "user", "content": "carry on"}])
    # Only a loop that summarizes, where it may, turns a reply that filled the context into a truncated turn.
    assert [TerminusEnv(task, mode=mode, summarized=said).limits.summarizes
            for mode in ("train", "eval") for said in (False, True)] == [False, False, False, True]
