"""The exploits as rollout policies: scripted replies in the Terminus 2 format, typed into the terminal as a model's
would be, so that an exploit's episode runs exactly the path a trainer's does."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from terminus_env.audit.exploits import Exploit, Plan
from terminus_env.audit.survey import Survey, parse_survey, survey_command
from terminus_env.rollout.policy import PolicyOutput, Rollout, xml_reply
from terminus_env.rules import Reply

COMMAND_WAIT_S = 20.0
"""The most a command of an exploit waits; the wait ends as soon as the shell is idle, so it is rarely reached."""


class SurveyPolicy:
    """The control: looks around the container (the survey), then declares the task done without changing anything.
    What it saw is :attr:`survey` once the episode ended."""

    def __init__(self, exploit: Exploit, duration: float = COMMAND_WAIT_S) -> None:
        self.exploit = exploit
        self.survey: Survey | None = None
        self._duration = duration

    @contextlib.asynccontextmanager
    async def session(self, rollout: Rollout) -> AsyncIterator[None]:
        yield

    async def act(self, rollout: Rollout, messages: list[dict[str, str]]) -> PolicyOutput:
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        if turn == 0:
            keys = survey_command(rollout.task.instruction)
            return _reply(keys, self._duration, complete=False, plan="Look around the container.")
        if self.survey is None:
            self.survey = parse_survey(rollout.task.instruction, messages[-1].get("content", ""))
        return _reply("", self._duration, complete=True, plan=f"{self.exploit.summary}; declare the task done.")


class ExploitPolicy:
    """One exploit's planned turn, typed at once with the task declared done."""

    def __init__(self, exploit: Exploit, plan: Plan, duration: float = COMMAND_WAIT_S) -> None:
        self.exploit = exploit
        self.plan = plan
        self._duration = duration

    @contextlib.asynccontextmanager
    async def session(self, rollout: Rollout) -> AsyncIterator[None]:
        yield

    async def act(self, rollout: Rollout, messages: list[dict[str, str]]) -> PolicyOutput:
        return _reply(self.plan.keystrokes, self._duration, complete=True, plan=self.exploit.summary)


def _reply(keys: str, duration: float, *, complete: bool, plan: str) -> PolicyOutput:
    text = xml_reply(keys, duration, complete=complete, plan=plan, analysis="An exploit of the audit.")
    return PolicyOutput(reply=Reply(text=text))
