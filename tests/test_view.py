"""``terminus-env view``: the pages of a real eval's job and of its trials, opened in a real headless Chromium, with
screenshots in ``test-artifacts/view/`` and assertions on the text the browser renders."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_support import ARTIFACTS, Browser, chromium_path
from task_support import BROKEN, FAILURE, TASK, eval_args, small_suite

from terminus_env.cli import main as cli_main
from terminus_env.records.report import build_report, with_ci
from terminus_env.records.run_log import read_run
from terminus_env.sandbox.images import prune_task_images

pytestmark = pytest.mark.usefixtures("docker_required")
SOLVED, UNSOLVED = f"{TASK}__0", f"{TASK}__1"
GREEN, RED, WHITE = "rgb(26, 127, 55)", "rgb(207, 34, 46)", "rgb(255, 255, 255)"
BADGE = "(s => [s.backgroundColor, s.color])(getComputedStyle(document.querySelector('.reward')))"
"""The reward badge's colours as the browser computes them."""


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """A flaky-oracle eval: its run file and its job folder."""
    root = tmp_path_factory.mktemp("view")
    suite = small_suite(root)
    cli_main(eval_args(suite, root / "run.jsonl", root / "jobs"))
    yield root / "run.jsonl", root / "jobs" / "run"
    prune_task_images({}, [suite])


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with Browser(chromium_path()) as browser:
        yield browser


def view(*args: str) -> int:
    return cli_main(["view", *args])


def look(browser: Browser, run: Path, trial: str, folder: Path) -> tuple[str, int]:
    """View ``trial`` of ``run``, open the page, save its screenshot as an artefact; the text shown and its height."""
    page = folder / f"{trial}.html"
    assert view(str(run), "--trial", trial, "--page", str(page)) == 0
    browser.open(page)
    shot = ARTIFACTS / "view" / f"{trial}.png"
    width, height = browser.screenshot(shot)
    assert shot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n") and width >= 1000
    return browser.shown_text(), height


def test_a_solved_trial_reads_turn_by_turn_in_a_browser(run: tuple[Path, Path], browser: Browser,
                                                         tmp_path: Path) -> None:  # fmt: skip
    output, job = run
    shown, height = look(browser, job, SOLVED, tmp_path)
    assert height > 1500  # the whole page, four turns long
    turns = next(r for r in read_run(output).rollouts if r.trial == 0).trajectory["turns"]
    assert f"{TASK} {SOLVED}" in shown
    assert "reward 1" in shown and "end reason task_complete" in shown and "format errors 1" in shown
    assert browser.evaluate(BADGE) == [GREEN, WHITE]  # the reward reads white on green
    assert [f"Turn {n}" in shown for n in range(1, 5)] == [True] * 4 and "Turn 5" not in shown
    assert f"Format error (nothing ran): {turns[0]['format_error']}" in shown  # the careless opening
    assert "Let me look at the task first." in shown
    assert "Oracle run." in shown and "Apply the reference solution." in shown  # analysis and plan, parsed
    assert "bash $S/solve.sh⏎" in shown  # the keystrokes, Enter shown
    assert "waits up to 60 s" in shown
    assert "New terminal output:" in shown and "root@" in shown  # the screen after
    assert "Marked the task complete." in shown
    assert "<analysis>" not in shown  # the whole reply stays folded away
    assert shown.rstrip().endswith("Ended: task_complete; reward 1.")


def test_an_unsolved_trial_from_the_run_file_says_why(run: tuple[Path, Path], browser: Browser,
                                                      tmp_path: Path) -> None:  # fmt: skip
    output, _ = run
    shown, _ = look(browser, output, UNSOLVED, tmp_path)
    assert "reward 0" in shown and f"Why it earned less than 1: {FAILURE}" in shown.replace("\n", " ")
    assert browser.evaluate(BADGE) == [RED, WHITE]
    assert "Give up." in shown and shown.rstrip().endswith("Ended: task_complete; reward 0.")
    assert "The verifier" in shown and "reward.txt: 0" in shown  # its output is open on a failed trial
    assert "test session starts" in shown and "AssertionError: /app/hello.txt is missing" in shown


def test_the_job_page_of_a_real_eval_scores_as_the_eval_and_opens_each_trial(
    run: tuple[Path, Path], browser: Browser, capsys: pytest.CaptureFixture[str]
) -> None:
    output, job = run
    assert view(str(job)) == 0
    assert capsys.readouterr().out.splitlines()[0] == str(job / "job.html")
    browser.open(job / "job.html")
    browser.screenshot(ARTIFACTS / "view" / "eval-job.png")
    shown = browser.shown_text()
    report = build_report(read_run(output))
    assert with_ci(report.overall) in shown and "0.500 ± 0.980 (0.000–1.000)" in shown  # as `eval` prints it
    rows = "Array.from(document.querySelectorAll('#tasks tbody tr')).map(r => r.dataset.task)"
    assert sorted(browser.evaluate(rows)) == sorted([BROKEN, TASK])
    assert "0.50 format errors per rollout" in shown  # the careless opening of the solved trial
    assert f"{BROKEN}__0 (TaskError): TaskError:" in shown  # a task that never ran is masked, with its error
    assert browser.follow(f'a.mark[data-trial="{SOLVED}"]') == (job / SOLVED / "trajectory.html").as_uri()
    shown = browser.shown_text()
    assert "reward 1" in shown and "Turn 4" in shown and "Marked the task complete." in shown
    page = (job / f"{BROKEN}__0" / "trajectory.html").read_text()
    assert "no trajectory" in page and "TaskError" in page  # a task that never ran says so
    assert view(str(job / SOLVED)) == 0  # a trial folder: its page alone
    assert capsys.readouterr().out.strip() == str(job / SOLVED / "trajectory.html")


def test_view_refuses_what_holds_no_trial_and_names_the_choices(
    run: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, job = run
    assert view(str(job), "--trial", "nope__0") == 2
    assert f"has no trial 'nope__0'; it has: {BROKEN}__0, {BROKEN}__1, {SOLVED}, {UNSOLVED}" in capsys.readouterr().err
    assert view(str(tmp_path)) == 2
    assert "not an eval run file (.jsonl), a training run's step log (.jsonl), a Harbor job folder or a trial " \
        "folder" in capsys.readouterr().err  # fmt: skip
    torn = tmp_path / "torn.jsonl"
    torn.write_text("not json\n")
    assert view(str(torn)) == 2
    assert "not an eval run record" in capsys.readouterr().err


def test_a_run_file_from_before_times_were_recorded_still_renders(run: tuple[Path, Path], tmp_path: Path) -> None:
    output, _ = run
    older = tmp_path / "older.jsonl"
    lines = []
    for line in output.read_text().splitlines():
        entry = json.loads(line)
        if entry.get("kind") == "rollout":
            trajectory = entry["trajectory"]
            for key in ("started_at", "ready_s", "screen", "grade_s"):
                trajectory.pop(key)
            for turn in trajectory["turns"]:
                for key in ("commands", "terminal", "replied_s", "observed_s"):
                    turn.pop(key)
        lines.append(json.dumps(entry))
    older.write_text("\n".join(lines) + "\n")
    page = tmp_path / "older.html"
    assert view(str(older), "--trial", SOLVED, "--page", str(page)) == 0
    text = page.read_text()
    assert "Turn 4" in text and "Oracle run." in text and "New terminal output:" in text
    assert "waits up to" not in text  # no record of what was typed: none is invented
