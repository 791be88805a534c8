"""Build hook: a wheel carries the shipped suite (the repository's tasks/) inside the package.

Tasks are written in tasks/ at the repository root; a wheel puts them at terminus_env/tasks/suite/,
where terminus_env.tasks.shipped_tasks_dir() finds them through importlib.resources. An editable
install copies nothing: it runs from the checkout, whose tasks/ is the suite, so no copy goes stale.
"""

from __future__ import annotations

from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SUITE_SOURCE = "tasks"
SUITE_IN_WHEEL = "terminus_env/tasks/suite"


class SuiteBuildHook(BuildHookInterface):
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if version == "standard":
            build_data["force_include"][SUITE_SOURCE] = SUITE_IN_WHEEL
