"""``terminus-env view RUN``: write the page of a job (a job folder or an eval run file) with a page per trial, of a
training run (its step log), or of one trial (a trial folder, or ``--trial NAME``), and say where they are.

Beside each job's or training run's page goes ``<page>.summary.json``: the same figures, for a dashboard of one's own.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from urllib.parse import quote

from terminus_env.records.step_log import is_step_log, read_step_log
from terminus_env.viewer.job_page import render_job
from terminus_env.viewer.job_source import Job, SourceKind, open_job
from terminus_env.viewer.job_summary import summarize_job
from terminus_env.viewer.page import render
from terminus_env.viewer.source import Trial, ViewError, find_trial, is_trial_folder
from terminus_env.viewer.training_page import render_training
from terminus_env.viewer.training_summary import summarize_training

PAGE = "trajectory.html"
"""A trial's page in its own folder."""
JOB_PAGE = "job.html"
"""A job folder's page, in the job folder."""
SUMMARY_SUFFIX = ".summary.json"
TRIALS_SUFFIX = ".trials"
"""The folder of trial pages beside a job's page written elsewhere than in its job folder."""


def main(args: argparse.Namespace) -> int:
    run = Path(args.run)
    output = Path(args.page) if args.page else None
    if output is not None and output.is_dir():
        raise ViewError(f"--page {output} is a folder; pass the page's file, such as {output / 'page.html'}")
    step_log = run.is_file() and is_step_log(run)
    if step_log and args.trial is not None:
        raise ViewError(f"{run} is a training run's step log: it has steps, not trials; drop --trial")
    if args.trial is not None or is_trial_folder(run):
        return _one_trial(run, args.trial, output)
    if step_log:
        return _training_run(run, output)
    return _job(run, output)


def _one_trial(run: Path, wanted: str | None, output: Path | None) -> int:
    found = find_trial(run, wanted)
    page = output or default_output(run, found.trial.name)
    _write(page, render(found.trial))
    print(page)
    return 0


def _job(run: Path, output: Path | None) -> int:
    job = open_job(run)
    page = output or (run / JOB_PAGE if job.kind is SourceKind.JOB_FOLDER else run.with_suffix(".html"))
    in_trial_folders = output is None and job.kind is SourceKind.JOB_FOLDER
    trial_pages = {result.name: (run / result.name / PAGE if in_trial_folders
                                 else page.parent / f"{page.stem}{TRIALS_SUFFIX}" / f"{result.name}.html")
                   for result in job.results}  # fmt: skip
    summary = summarize_job(job, {name: _link(path, page.parent) for name, path in trial_pages.items()})
    data = page.with_name(page.stem + SUMMARY_SUFFIX)
    for name, path in trial_pages.items():
        _write(path, render(_trial(job, name), job_page=_link(page, path.parent)))
    _write(data, json.dumps(summary.as_dict(), indent=1, ensure_ascii=False))
    _write(page, render_job(summary, data_file=data.name))
    print(page)
    where = run if in_trial_folders else page.parent / f"{page.stem}{TRIALS_SUFFIX}"
    print(f"{len(trial_pages)} trial pages in {where}; the figures as JSON in {data}")
    return 0


def _training_run(run: Path, output: Path | None) -> int:
    page = output or run.with_suffix(".html")
    summary = summarize_training(run.stem, str(run), read_step_log(run))
    data = page.with_name(page.stem + SUMMARY_SUFFIX)
    _write(data, json.dumps(summary.as_dict(), indent=1, ensure_ascii=False))
    _write(page, render_training(summary, data_file=data.name))
    print(page)
    print(f"{len(summary.steps)} steps; the figures as JSON in {data}")
    return 0


def _trial(job: Job, name: str) -> Trial:
    """The trial for its page; one whose files cannot be read gets a page from its result alone, and a warning."""
    try:
        return job.trial(name)
    except ViewError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        result = next(r for r in job.results if r.name == name)
        return Trial(name, None, result.result, end_reason=result.end_reason)


def _link(target: Path, start: Path) -> str:
    """A relative URL from a page in ``start`` to ``target``."""
    relative = os.path.relpath(target.resolve(), start.resolve())
    return "/".join(quote(part) for part in Path(relative).parts)


def _write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ViewError(f"cannot write {path} ({exc}); pass --page PAGE.html somewhere writable") from exc


def default_output(run: Path, trial: str) -> Path:
    """Beside what was given: in the trial's folder, or next to the run file."""
    if run.is_file():
        return run.with_name(f"{run.stem}.{trial}.html")
    if run.name == trial:
        return run / PAGE
    return run / trial / PAGE
