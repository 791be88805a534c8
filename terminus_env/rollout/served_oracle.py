"""The flaky oracle as a served "model": a reply source for the simulated replica that any harness can talk to.

It gives the same episodes under any harness that speaks Terminus 2 (this package's eval, Harbor's own Terminus 2
agent), so the two can be compared on the same policy. It recognises the task from the conversation (its
instruction appears in it whatever the prompt's wording), and an episode from its own replies: each one carries a
``STATE episode=K step=S`` line, as a model carries its plan along, and the summaries it writes carry it over a
context summarization. What a step does is fixed by the episode's draws, hashed from the seed as the flaky oracle's
(:class:`FlakyOraclePolicy`) are, with the k-th episode of a task drawn as that policy's trial k:

- one episode in three opens with a reply in no format (a format error);
- ``probes`` turns (per task; none by default) print a few kilobytes of text each, so the conversation grows;
- it applies the reference solution with the task's odds and marks the task complete, or marks it complete at once;
- it confirms completion when asked.

The summarization requests of either wording are answered with the state, so the episode carries on where the
summary says it stands: exchanges dropped before a summary (a reactive one drops the latest) are played again.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping, Sequence

from terminus_env.protocol import prompts
from terminus_env.rollout.policy import draw, solution_keystrokes, xml_reply
from terminus_env.tasks import Task

PROBE_LINES = 300
"""Lines a probe prints: about 18 KB, which both harnesses cap at 10 KB of output."""
_STATE = re.compile(r"STATE episode=(\d+) step=(\d+)")
_CARELESS = "Let me look at the task first."
_PROBE = f'for i in $(seq 1 {PROBE_LINES}); do echo "probe line $i: the quick brown fox jumps over the dog"; done\n'
# How each harness words its summarization requests: ours (terminus_env.protocol.prompts) and Terminus 2's.
_REQUESTS = {
    "summary": (prompts.summary_request("")[:40], "hand off your work to another AI agent"),
    "questions": (prompts.questions_request("", "", "")[:40], "You are picking up work from a previous AI agent"),
    "answers": (prompts.answers_request("")[:40], "The next agent has a few questions for you"),
    "short": (prompts.short_summary_request("", "")[:40], "Briefly continue this task"),
}


class FlakyOracleReplies:
    """``(messages) -> reply`` for :class:`terminus_env.serving.sim.server.SimServer`; thread-safe."""

    def __init__(
        self, tasks: Sequence[Task], seed: int, *, probes: Mapping[str, int] | None = None,
        command_duration: float = 5.0,
    ) -> None:  # fmt: skip
        self._tasks = sorted(tasks, key=lambda t: len(t.instruction), reverse=True)  # most specific first
        self._seed = seed
        self._probes = dict(probes or {})
        self._duration = command_duration
        self._episodes: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, messages: list[dict[str, str]]) -> str:
        task = self._task(messages)
        asked = _request(messages)
        state = _latest_state(messages)
        if asked is not None:
            return _answer(asked, task, state)
        if state is None and len(messages) > 1:  # a summary that kept nothing of the episode: it can only stop
            return xml_reply("", 1.0, complete=True, plan="Mark the task complete.", analysis="The state is lost.")
        if state is None:
            with self._lock:
                episode = self._episodes.get(task.name, 0)
                self._episodes[task.name] = episode + 1
            step = 0
        else:
            episode, step = state[0], state[1] + 1
        return self._step(task, episode, step)

    def plan(self, task: Task, episode: int) -> list[str]:
        """The episode's steps; once they are done, it confirms completion."""
        key = f"{task.name}#{episode}"
        steps = ["careless"] if draw(self._seed, "careless", key) < 1 / 3 else []
        steps += ["probe"] * self._probes.get(task.name, 0)
        if draw(self._seed, "solve", key) < draw(self._seed, "rate", task.name):
            return [*steps, "solve", "complete"]
        return [*steps, "complete"]

    def _step(self, task: Task, episode: int, step: int) -> str:
        plan = self.plan(task, episode)
        action = plan[step] if step < len(plan) else "complete"
        state = f"STATE episode={episode} step={step}"
        if action == "careless":
            return f"{_CARELESS} {state}"
        if action == "probe":
            return xml_reply(_PROBE, 1.0, complete=False, plan="Look around.", analysis=state)
        if action == "solve":
            return xml_reply(solution_keystrokes(task), self._duration, complete=False,
                             plan="Apply the reference solution.", analysis=state)  # fmt: skip
        return xml_reply("", 1.0, complete=True, plan="Mark the task complete.", analysis=state)

    def _task(self, messages: list[dict[str, str]]) -> Task:
        text = "\n".join(str(m.get("content", "")) for m in messages)
        for task in self._tasks:
            if task.instruction.strip() in text:
                return task
        raise LookupError("served oracle: no known task instruction appears in the conversation")


def _request(messages: list[dict[str, str]]) -> str | None:
    """Which summarization request the last message is, in either wording; None for a turn of the episode."""
    last = str(messages[-1].get("content", "")) if messages else ""
    for name, markers in _REQUESTS.items():
        if any(marker and marker in last for marker in markers):
            return name
    return None


def _latest_state(messages: list[dict[str, str]]) -> tuple[int, int] | None:
    for message in reversed(messages):
        found = _STATE.findall(str(message.get("content", "")))
        if found:
            episode, step = found[-1]
            return int(episode), int(step)
    return None


def _answer(asked: str, task: Task, state: tuple[int, int] | None) -> str:
    where = "nothing done yet" if state is None else f"STATE episode={state[0]} step={state[1]}"
    if asked == "questions":
        return "\n".join(f"{n}. {q}" for n, q in enumerate(
            ["Which commands ran?", "What did they print?", "Which files changed?", "What is left to do?",
             f"Where does it stand? {where}"], 1))  # fmt: skip
    return f"Working on {task.name}: the plan is carried out step by step. {where}"
