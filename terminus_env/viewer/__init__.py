"""``terminus-env view``: static HTML pages that open offline. A job (a Harbor job folder or an eval run file): the
score, a table of its tasks, how its trials ended, and a page per trial, turn by turn. A training run (its step log,
:mod:`terminus_env.records.step_log`): per step, the reward, the end reasons' shares, format errors, turns, tokens,
tamper and masked rates.

Summaries are pure data (``job_summary``, ``training_summary``: dataclasses, written beside each page as JSON); the
pages (``job_page``, ``training_page``, ``page``) are rendered from them, their charts by ``charts``.
"""

from terminus_env.viewer.job_page import render_job
from terminus_env.viewer.job_source import Job, open_job
from terminus_env.viewer.job_summary import JobSummary, summarize_job
from terminus_env.viewer.page import render
from terminus_env.viewer.source import Found, Trial, ViewError, find_trial
from terminus_env.viewer.training_page import render_training
from terminus_env.viewer.training_summary import TrainingSummary, summarize_training

__all__ = [
    "Found",
    "Job",
    "JobSummary",
    "TrainingSummary",
    "Trial",
    "ViewError",
    "find_trial",
    "open_job",
    "render",
    "render_job",
    "render_training",
    "summarize_job",
    "summarize_training",
]
