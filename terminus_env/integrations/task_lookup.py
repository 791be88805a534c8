"""Which task a trainer's prompt or dataset row names: RL libraries hand adapters prompts, not tasks."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from terminus_env.errors import TerminusError
from terminus_env.tasks import Task


class UnknownTask(TerminusError, LookupError):
    """A prompt or dataset row names no task the adapter was given."""


class TaskLookup:
    """Finds a task by its name, or by its instruction appearing in a prompt."""

    def __init__(self, tasks: Iterable[Task]) -> None:
        self._by_name = {task.name: task for task in tasks}
        if not self._by_name:
            raise ValueError("no tasks given: pass the tasks the trainer's dataset names (load_tasks(folder))")
        # Longest instruction first, so a task whose instruction contains another's still wins.
        self._by_instruction = sorted(self._by_name.values(), key=lambda t: len(t.instruction), reverse=True)

    @property
    def names(self) -> list[str]:
        return sorted(self._by_name)

    def get(self, name: str) -> Task:
        try:
            return self._by_name[name]
        except KeyError:
            raise UnknownTask(f"unknown task {name!r}; the adapter knows {', '.join(self.names)}") from None

    def for_prompt(self, prompt: Any) -> Task:
        """The task of a prompt: a task name, or text (or chat messages) holding a task's instruction."""
        text = prompt_text(prompt).strip()
        if text in self._by_name:
            return self._by_name[text]
        for task in self._by_instruction:
            if task.instruction.strip() and task.instruction.strip() in text:
                return task
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
