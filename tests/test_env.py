"""The Gymnasium env on a real Docker sandbox: strict and lenient semantics, metrics, Gymnasium API."""

from __future__ import annotations

import contextlib
import dataclasses

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

from terminus_env import Reply, TerminusEnv, load_task
from terminus_env.config import ConfigError

pytestmark = pytest.mark.usefixtures("docker_required")

WRITE = "echo hello > /app/hello.txt\n"
PLAIN = "I will now write the file."  # no <response>: rejected


def reply(keystrokes: str = "", *, complete: bool = False, duration: float = 1.0) -> str:
    done = "<task_complete>true</task_complete>" if complete else ""
    return (
        "<response><analysis>Looking.</analysis><plan>Act.</plan>"
        f'<commands><keystrokes duration="{duration}">{keystrokes}</keystrokes></commands>{done}</response>'
    )


@pytest.fixture(scope="module")
def task(tiny_task_dir):
    return load_task(tiny_task_dir)


def make(task, **kwargs) -> TerminusEnv:
    return TerminusEnv(task, **kwargs)


@contextlib.contextmanager
def started(task, **kwargs):
    """An env already reset, closed afterwards whatever happens."""
    with contextlib.closing(make(task, **kwargs)) as env:
        env.reset()
        yield env


def play(env: TerminusEnv, replies: list[str | Reply]):
    """Step through replies until the episode ends; return every step's result."""
    results = []
    for action in replies:
        results.append(env.step(action))
        if results[-1][2] or results[-1][3]:
            break
    return results


def test_lenient_recovers_from_a_broken_first_turn_and_counts_it_rescued(task):
    with contextlib.closing(make(task, mode="eval")) as env:
        obs, info = env.reset()
        assert "/app/hello.txt" in obs and info["messages"][0]["content"] == obs
        results = play(env, [PLAIN, reply(WRITE, complete=True), reply(complete=True)])
        first_obs, _, terminated, _, first_info = results[0]
        assert not terminated
        assert first_info["format_error"] and first_info["format_errors"] == 1
        assert first_info["format_error_opening_streak"] == 1
        assert "<response>" in first_obs  # the feedback asks for a proper reply
        confirm_obs = results[1][0]
        assert "sure" in confirm_obs.lower() or "confirm" in confirm_obs.lower()
        _, reward, terminated, truncated, info = results[-1]
        assert (reward, terminated, truncated) == (1.0, True, False)
        assert info["end_reason"] == "task_complete"
        episode = info["episode"]
        assert episode["rescued"] is True and episode["graded"] is True
        # What a trainer masks, under its name and, for one release, its former one.
        assert info["masked"] is info["env_error"] is episode["masked"] is episode["env_error"] is False
        assert episode["format_errors"] == 1 and episode["format_error_opening_streak"] == 1


def test_strict_ends_at_the_first_rejected_turn_ungraded(task):
    with started(task, mode="train") as env:
        _, reward, terminated, truncated, info = env.step(PLAIN)
        assert (reward, terminated, truncated) == (0.0, True, False)
        assert info["end_reason"] == "format_error"
        assert info["episode"]["graded"] is False and info["episode"]["rescued"] is False
        assert info["format_error_opening_streak"] == 1
        with pytest.raises(RuntimeError, match="reset"):
            env.step(reply(WRITE))
        env.close()  # closed here, and again on leaving: twice is fine


@pytest.mark.parametrize(
    ("opening", "streak"),
    [([], 0), ([PLAIN], 1), ([PLAIN, "<response><analysis>x</analysis></response>"], 2)],
)
def test_opening_streak_counts_only_the_broken_opening(task, opening, streak):
    with started(task, mode="eval") as env:
        later_break = [reply(WRITE), PLAIN]  # a break after an accepted turn is an error, not streak
        results = play(env, [*opening, *later_break, reply(complete=True), reply(complete=True)])
        info = results[-1][4]
        assert info["episode"]["format_error_opening_streak"] == streak
        assert info["episode"]["format_errors"] == streak + 1
        assert results[-1][1] == 1.0


def test_empty_commands_are_a_warning_even_when_strict(task):
    with started(task, mode="train") as env:
        obs, _, terminated, _, info = env.step(
            "<response><analysis>a</analysis><plan>p</plan><commands></commands></response>"
        )
        assert not terminated and info["format_error"] is None and info["warnings"]
        obs, _, terminated, _, info = env.step(
            "<response><analysis>a</analysis><plan>p</plan><commands>ls</commands></response>"
        )
        assert not terminated and info["format_error"] is None and info["warnings"]  # silent no-op, reported


def test_truncated_turn_strict_ends_without_salvage(task):
    with started(task, mode="train") as env:
        cut = Reply(reply(WRITE) + "<response>more", finish_reason="length")
        _, reward, terminated, _, info = env.step(cut)
        assert (reward, terminated, info["end_reason"]) == (0.0, True, "turn_truncated")
        assert info["truncated_turns"] == 1 and info["episode"]["graded"] is False


def test_truncated_turn_counts_by_tokens_too(task):
    with started(task, mode="train", max_turn_tokens=100) as env:
        _, _, terminated, _, info = env.step(Reply(reply("ls\n"), completion_tokens=100))
        assert terminated and info["end_reason"] == "turn_truncated"


def test_truncated_turn_lenient_salvages_or_says_nothing_ran(task):
    with started(task, mode="eval") as env:
        opening = '<response><analysis>a</analysis><commands><keystrokes duration="1">'
        unsalvageable = Reply(opening + WRITE, finish_reason="length")
        obs, _, terminated, _, info = env.step(unsalvageable)
        assert not terminated and info["truncated_turns"] == 1 and info["format_error"] is None
        assert "limit" in obs.lower()
        obs, *_ = env.step(reply("cat /app/hello.txt || echo MISSING\n"))
        assert "MISSING" in obs  # nothing ran
        salvageable = Reply(reply(WRITE) + "\n<response>trailing junk that was cut", finish_reason="length")
        _, _, terminated, _, info = env.step(salvageable)
        assert not terminated and info["truncated_turns"] == 2
        results = play(env, [reply(complete=True), reply(complete=True)])
        assert results[-1][1] == 1.0  # the salvaged command ran


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_context_limit_ends_with_zero_in_any_mode(task, mode):
    with started(task, mode=mode, max_context_tokens=1000) as env:
        _, reward, terminated, _, info = env.step(Reply(reply(WRITE), prompt_tokens=1001))
        ended = (reward, terminated, info["end_reason"], info["episode"]["graded"])
        assert ended == (0.0, True, "context_limit", False)
        env.reset()
        _, _, terminated, _, info = env.step(Reply("", finish_reason="context_length"))
        assert terminated and info["end_reason"] == "context_limit"


def test_max_turns_truncates_and_still_grades(task):
    with started(task, mode="eval", max_turns=2) as env:
        results = play(env, [reply(WRITE), reply("ls\n"), reply("ls\n")])
        _, reward, terminated, truncated, info = results[-1]
        assert len(results) == 2 and (terminated, truncated) == (False, True)
        assert info["end_reason"] == "max_turns" and info["episode"]["graded"] and reward == 1.0


def test_max_turns_counts_rejected_and_truncated_turns_too(task):
    with started(task, mode="eval", max_turns=2) as env:
        results = play(env, [PLAIN, Reply("<response>cut", finish_reason="length"), PLAIN])
        _, reward, _, truncated, info = results[-1]
        assert len(results) == 2 and truncated and info["end_reason"] == "max_turns"
        assert info["episode"]["graded"] and reward == 0.0 and info["truncated_turns"] == 1


def test_agent_timeout_truncates_and_still_grades(task):
    with started(dataclasses.replace(task, agent_timeout_s=2.0), mode="eval") as env:
        env.step(reply(WRITE))
        _, reward, _, truncated, info = env.step(reply("sleep 30\n", duration=10))
        assert truncated and info["end_reason"] == "agent_timeout" and reward == 1.0


def test_strictness_comes_from_variables_and_arguments_win(task):
    assert make(task, mode="train").strictness.strict_format is True
    assert make(task, mode="eval").strictness.strict_format is False
    lenient = make(task, mode="train", environ={"SWE_STRICT_FORMAT": "0", "SWE_STRICT_TRUNCATION": "false"})
    assert (lenient.strictness.strict_format, lenient.strictness.strict_truncation) == (False, False)
    forced = make(task, mode="eval", strict_format=True, environ={"SWE_EVAL_STRICT_FORMAT": "0"})
    assert forced.strictness.strict_format is True
    with pytest.raises(ConfigError, match="SWE_EVAL_STRICT_TRUNCATION"):
        make(task, mode="eval", environ={"SWE_EVAL_STRICT_TRUNCATION": "maybe"})


def test_check_env_passes(task):
    with contextlib.closing(make(task, mode="train")) as env:
        check_env(env.unwrapped)


def test_gymnasium_make_and_a_full_episode(tiny_task_dir):
    with contextlib.closing(gymnasium.make("terminus_env/Terminus-v0", task=tiny_task_dir, mode="eval")) as env:
        assert env.spec.nondeterministic is True
        obs, _ = env.reset(seed=0)
        assert obs in env.observation_space
        results = play(env, [reply(WRITE, complete=True), reply(complete=True)])
        assert results[-1][1] == 1.0


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_make_vec(tiny_task_dir, mode):
    vector_kwargs = {"shared_memory": False} if mode == "async" else {}
    vector = gymnasium.make_vec(
        "terminus_env/Terminus-v0", num_envs=4, vectorization_mode=mode, vector_kwargs=vector_kwargs,
        task=str(tiny_task_dir), mode="eval",
    )
    with contextlib.closing(vector) as envs:
        obs, _ = envs.reset(seed=1)
        assert len(obs) == 4 and all("/app/hello.txt" in o for o in obs)
        for actions in ([reply(WRITE, complete=True)] * 4, [reply(complete=True)] * 4):
            obs, rewards, terminated, truncated, infos = envs.step(tuple(actions))
        assert list(rewards) == [1.0] * 4 and all(terminated)


@pytest.mark.parametrize("action", [b"<response></response>", None, 42])
def test_a_bad_action_is_refused_before_the_episode_changes(task, action):
    with started(task, mode="eval") as env:
        before = env.messages
        with pytest.raises(TypeError):
            env.step(action)
        _, _, _, _, info = env.step(reply(WRITE))
    assert env.messages[: len(before)] == before and info["turn"] == 1
