"""Which task a trainer's prompt or dataset row names: RL libraries hand adapters prompts, not tasks."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from terminus_env.audit.report import AuditReport
from terminus_env.audit.screen import Hackable, load_screen
from terminus_env.errors import TerminusError
from terminus_env.rollout.trajectory import Trajectory
from terminus_env.tasks import Task

logger = logging.getLogger(__name__)


class UnknownTask(TerminusError, LookupError):
    """A prompt or dataset row names no task the adapter was given."""


class HackableTask(UnknownTask):
    """A prompt or dataset row names a task that the audit report left out as hackable (``hackable="skip"``)."""


class TaskLookup:
    """Finds a task by its name, or by its instruction appearing in a prompt.

    With ``audit_report`` (a report of ``terminus-env tasks audit``, or its file), the tasks it found hackable are
    left out (``hackable="skip"``: a row naming one raises :class:`HackableTask`, so build the dataset from
    ``terminus_env.audit.screen_tasks``) or kept and marked (``"mark"``: :meth:`hackable` names what passed them,
    and the adapters report it beside the rewards).
    """

    def __init__(
        self, tasks: Iterable[Task], *, audit_report: Path | str | AuditReport | None = None,
        hackable: Hackable | str = Hackable.SKIP,
    ) -> None:  # fmt: skip
        all_tasks = list(tasks)
        self._screen = load_screen(audit_report, hackable)
        self._left_out = {t.name: t for t in all_tasks if self._screen is not None and not self._screen.keeps(t.name)}
        self._by_name = {task.name: task for task in all_tasks if task.name not in self._left_out}
        if not self._by_name:
            left = " (the audit report left every one out as hackable)" if self._left_out else ""
            raise ValueError(f"no tasks given{left}: pass the tasks the trainer's dataset names (load_tasks(folder))")
        marked = [name for name in self._by_name if self.hackable(name)]
        if marked:
            logger.warning("training on %d task(s) the audit report found hackable: %s", len(marked),
                           ", ".join(f"{name} ({self.hackable(name)})" for name in marked))  # fmt: skip
        # Longest instruction first, so a task whose instruction contains another's still wins.
        self._by_instruction = sorted(self._by_name.values(), key=lambda t: len(t.instruction), reverse=True)

    @property
    def names(self) -> list[str]:
        return sorted(self._by_name)

    def hackable(self, name: str) -> str | None:
        """What passed the task without solving it, when the audit report found it hackable, else None."""
        return None if self._screen is None else self._screen.mark(name)

    def get(self, name: str) -> Task:
        try:
            return self._by_name[name]
        except KeyError:
            if name in self._left_out and self._screen is not None:
                raise HackableTask(self._screen.why_left_out(name)) from None
            raise UnknownTask(f"unknown task {name!r}; the adapter knows {', '.join(self.names)}") from None

    def for_prompt(self, prompt: Any) -> Task:
        """The task of a prompt: a task name, or text (or chat messages) holding a task's instruction."""
        text = prompt_text(prompt).strip()
        if text in self._by_name:
            return self._by_name[text]
        for task in self._by_instruction:
            if task.instruction.strip() and task.instruction.strip() in text:
                return task
        for name, task in self._left_out.items():
            if self._screen is not None and (text == name or (task.instruction.strip() and task.instruction.strip()
                                                               in text)):  # fmt: skip
                raise HackableTask(self._screen.why_left_out(name))
        raise UnknownTask(
            f"the prompt {text[:80]!r} names no known task: make each dataset prompt a task name "
            f"({', '.join(self.names[:5])}, ...) or contain the task's instruction"
        )

    def for_row(self, row: Mapping[str, Any] | None, prompt: Any = None) -> Task:
        """The task of a dataset row: its ``task`` field (top level or in ``extra_info``), else its prompt."""
        row = row or {}
        extra = row.get("extra_info")
        for source in (row, extra if isinstance(extra, Mapping) else {}):
            name = source.get("task")
            if isinstance(name, str):
                return self.get(name)
        return self.for_prompt(prompt if prompt is not None else row.get("prompt", ""))


def prompt_text(prompt: Any) -> str:
    """A prompt's text: a string, or the last user message of a chat (OpenAI style)."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Mapping):
        content = prompt.get("content", "")
        return content if isinstance(content, str) else "".join(p.get("text", "") for p in content)
    messages = list(prompt or [])
    users = [m for m in messages if isinstance(m, Mapping) and m.get("role") == "user"]
    return prompt_text(users[-1]) if users else ""


def hackable_share(lookup: TaskLookup, trajectories: Iterable[Trajectory]) -> float:
    """The share of a batch's rollouts played on tasks the audit report marked hackable (0 without a report)."""
    tasks = [t.task for t in trajectories]
    return sum(1 for name in tasks if lookup.hackable(name)) / len(tasks) if tasks else 0.0
