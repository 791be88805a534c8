"""Terminal tasks: load them (Harbor and Terminal-Bench 1 formats), grade episodes, check suites."""

from terminus_env.tasks.grading import GradeResult, apply_oracle, grade
from terminus_env.tasks.loader import find_task, load_task, load_tasks, shipped_tasks_dir
from terminus_env.tasks.task import Task, TaskError, task_image

__all__ = [
    "GradeResult", "Task", "TaskError", "apply_oracle", "find_task", "grade", "load_task", "load_tasks",
    "shipped_tasks_dir", "task_image",
]  # fmt: skip
