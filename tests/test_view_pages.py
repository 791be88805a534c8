"""The job's and the training run's pages in a real headless Chromium, as a person uses them: the rows and the charts
are there, a trial's mark opens that trial's page and its link leads back, the filters hide rows, a header sorts.
Screenshots go to ``test-artifacts/view/``. The job is a synthetic eval written by the eval's own writers
(``view_support``); tests/test_view.py looks at the pages of a real one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_support import ARTIFACTS, Browser, chromium_path
from view_support import BROKEN_TASK, Synthetic, strict_training_steps, write_synthetic_job

from terminus_env.cli import main as cli_main
from terminus_env.records.step_log import StepLog

TASKS, TRIALS = 30, 4
SHOWN_ROWS = "Array.from(document.querySelectorAll('#tasks tbody tr')).filter(r => !r.hidden).map(r => r.dataset.task)"
"""The task of each row the table shows, top to bottom."""
MEAN_REWARDS = "Array.from(document.querySelectorAll('#tasks tbody tr')).map(r => r.cells[2].dataset.v)"


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Synthetic:
    made = write_synthetic_job(tmp_path_factory.mktemp("pages"), tasks=TASKS, trials=TRIALS, seed=11)
    assert cli_main(["view", str(made.job)]) == 0
    return made


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with Browser(chromium_path()) as browser:
        yield browser


def type_into(browser: Browser, control: str, value: str) -> None:
    """Set a filter's value and fire the event a person's typing or choosing fires."""
    browser.evaluate(f"(c => {{ c.value = {value!r}; c.dispatchEvent(new Event('input', {{bubbles: true}})); }})"
                     f"(document.getElementById({control!r}))")  # fmt: skip


def test_the_job_page_shows_the_score_the_rows_and_the_chart(job: Synthetic, browser: Browser) -> None:
    browser.open(job.job / "job.html")
    shot = ARTIFACTS / "view" / "job.png"
    width, height = browser.screenshot(shot)
    assert shot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n") and width >= 1000 and height > 1500
    shown = browser.shown_text()
    assert "SCORE ± 95% CI" in shown and f"PASS@{TRIALS}" in shown and "over 29 tasks" in shown
    assert browser.evaluate(SHOWN_ROWS) == [f"task-{n:03d}" for n in range(TASKS - 1)] + [BROKEN_TASK]
    assert f"{TASKS} of {TASKS} tasks shown" in shown
    marks = browser.evaluate("document.querySelectorAll('#tasks a.mark').length")
    assert marks == TASKS * TRIALS
    bars = browser.evaluate("Array.from(document.querySelectorAll('[data-chart=end-reasons] g.bar'))"
                            ".map(g => [g.dataset.label, g.getBoundingClientRect().width > 0])")  # fmt: skip
    assert ["task_complete", True] in bars and ["load_error", True] not in bars and ["TaskError", True] in bars
    assert len(bars) >= 5  # completions, limits, format errors, env errors and the broken task, at least
    assert "Masked" in shown and f"{BROKEN_TASK}__0 (TaskError): TaskError: task.toml" in shown
    assert "Tampering" in shown and "conftest /app/conftest.py: a pytest plugin the agent wrote" in shown


def test_a_trials_mark_opens_its_page_with_the_verifier_and_the_way_back(job: Synthetic, browser: Browser) -> None:
    browser.open(job.job / "job.html")
    flagged = next(r for r in job.rollouts if (r.summary or {}).get("tampering") and r.reward < 1)
    name = f"{flagged.task}__{flagged.trial}"
    url = browser.follow(f'a.mark[data-trial="{name}"]')
    assert url == (job.job / name / "trajectory.html").as_uri()
    shown = browser.shown_text()
    assert f"{flagged.task} {name}" in shown and "Flagged for tampering:" in shown and "/app/conftest.py" in shown
    assert "The verifier" in shown and "reward.txt: 0" in shown and "test session starts" in shown  # open: unsolved
    browser.screenshot(ARTIFACTS / "view" / "job-trial.png")
    assert browser.follow("p.back a") == (job.job / "job.html").as_uri()
    assert browser.evaluate(SHOWN_ROWS)[0] == "task-000"


def test_the_filters_hide_the_rows_that_do_not_match(job: Synthetic, browser: Browser) -> None:
    browser.open(job.job / "job.html")
    type_into(browser, "filter-task", "task-01")
    assert browser.evaluate(SHOWN_ROWS) == [f"task-0{n}" for n in range(10, 20)]
    assert "10 of 30 tasks shown" in browser.shown_text()
    type_into(browser, "filter-task", "")
    type_into(browser, "filter-reward", "unscored")
    assert browser.evaluate(SHOWN_ROWS) == [BROKEN_TASK]
    type_into(browser, "filter-reward", "")
    type_into(browser, "filter-reason", "format_error")
    expected = sorted({r.task for r in job.rollouts if r.end_reason == "format_error"})
    assert browser.evaluate(SHOWN_ROWS) == expected and 0 < len(expected) < TASKS
    dimmed = browser.evaluate("Array.from(document.querySelectorAll('tr:not([hidden]) a.mark'))"
                              ".map(m => [m.dataset.reason, m.classList.contains('dim')])")  # fmt: skip
    assert dimmed and all(dim == (reason != "format_error") for reason, dim in dimmed)
    browser.screenshot(ARTIFACTS / "view" / "job-filtered.png")


def test_a_header_sorts_the_tasks_and_sorts_back(job: Synthetic, browser: Browser) -> None:
    browser.open(job.job / "job.html")
    header = "document.querySelectorAll('#tasks thead th')[2]"
    assert browser.evaluate(f"{header}.textContent") == "mean reward"
    browser.evaluate(f"{header}.click()")
    rising = browser.evaluate(MEAN_REWARDS)
    scored = [float(v) for v in rising if v != ""]
    assert scored == sorted(scored) and rising[-1] == "" and scored[0] < scored[-1]  # no reward: last
    browser.evaluate(f"{header}.click()")
    falling = browser.evaluate(MEAN_REWARDS)
    assert [float(v) for v in falling if v != ""] == sorted(scored, reverse=True) and falling[-1] == ""
    assert browser.evaluate(f"{header}.getAttribute('aria-sort')") == "descending"


def test_the_training_run_page_plots_each_step(tmp_path: Path, browser: Browser) -> None:
    log = StepLog(tmp_path / "steps.jsonl")
    for batch in strict_training_steps(40, 32, seed=2):
        log.add(batch)
    assert cli_main(["view", str(log.path)]) == 0
    browser.open(tmp_path / "steps.html")
    width, height = browser.screenshot(ARTIFACTS / "view" / "training.png")
    assert width >= 1000 and height > 1500
    charts = browser.evaluate("Array.from(document.querySelectorAll('figure.chart')).map(f => f.dataset.chart)")
    assert charts == ["reward", "end-reasons", "format-errors", "turns", "tokens", "rates"]
    layers = browser.evaluate("Array.from(document.querySelectorAll('[data-chart=end-reasons] polygon'))"
                              ".map(p => [p.dataset.series, p.getBBox().width > 600])")  # fmt: skip
    assert ["format_error", True] in layers and ["task_complete", True] in layers  # across every step
    assert browser.evaluate("document.querySelectorAll('#steps tbody tr').length") == 40
    shown = browser.shown_text()
    assert "How the episodes ended" in shown and "Tampered and masked" in shown and "STEPS\n40" in shown
