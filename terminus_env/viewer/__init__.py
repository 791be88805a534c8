"""``terminus-env view``: one trajectory of a run as a static HTML page, turn by turn."""

from terminus_env.viewer.page import render
from terminus_env.viewer.source import Found, Trial, ViewError, find_trial

__all__ = ["Found", "Trial", "ViewError", "find_trial", "render"]
