"""The job's and the training run's pages as data, without a browser: the summaries, the files ``terminus-env view``
writes, and that every page is self-contained (parsed, not searched). A synthetic eval written by the eval's own
writers (``view_support``); the browser's view of the same pages is tests/test_view_pages.py."""

from __future__ import annotations

import json
import random
from html.parser import HTMLParser
from pathlib import Path

import pytest
from view_support import BROKEN_TASK, TAMPER_FINDING, Synthetic, strict_training_steps, write_synthetic_job

from terminus_env.cli import main as cli_main
from terminus_env.records.report import build_report, with_ci
from terminus_env.records.run_log import read_run
from terminus_env.records.step_log import StepLog, StepLogError, is_step_log, read_step_log, step_record
from terminus_env.rules import EndReason
from terminus_env.training import MaskingPolicy, TimeLimitEnds
from terminus_env.viewer.charts import Series, _ticks, line_chart, stacked_shares
from terminus_env.viewer.job_source import SourceKind, open_job
from terminus_env.viewer.job_summary import summarize_job
from terminus_env.viewer.training_summary import summarize_training

TASKS, TRIALS = 12, 3


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Synthetic:
    return write_synthetic_job(tmp_path_factory.mktemp("synthetic"), tasks=TASKS, trials=TRIALS, seed=3)


def view(*args: str | Path) -> int:
    return cli_main(["view", *map(str, args)])


class Outside(HTMLParser):
    """What a page would fetch: scripts, style sheets, fonts, images, frames, by any attribute or CSS rule."""

    def __init__(self) -> None:
        super().__init__()
        self.fetches: list[str] = []
        self.tags: set[str] = set()
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        values = dict(attrs)
        if tag in ("link", "iframe", "object", "embed", "img", "source", "video", "audio"):
            self.fetches.append(f"<{tag}>")
        for name in ("src", "srcset", "data", "poster"):
            if values.get(name):
                self.fetches.append(f"<{tag} {name}={values[name]}>")
        if tag == "a" and ":" in (values.get("href") or "").split("/")[0]:
            self.fetches.append(f"<a href={values['href']}>")  # a link off the page's own files
        self._in_style = tag == "style"

    def handle_endtag(self, tag: str) -> None:
        self._in_style = False

    def handle_data(self, data: str) -> None:
        if self._in_style and any(rule in data for rule in ("@import", "@font-face", "url(")):
            self.fetches.append("a style rule that loads a file")


def outside_of(page: Path) -> list[str]:
    parser = Outside()
    parser.feed(page.read_text(encoding="utf-8"))
    assert "body" in parser.tags  # it parsed as a page
    return parser.fetches


def test_the_job_folder_and_its_run_file_give_the_eval_reports_numbers(synthetic: Synthetic) -> None:
    contents = read_run(synthetic.run_file)
    expected = build_report(contents)
    folder, run_file = open_job(synthetic.job), open_job(synthetic.run_file)
    assert (folder.kind, run_file.kind) == (SourceKind.JOB_FOLDER, SourceKind.RUN_FILE)
    assert folder.k == run_file.k == TRIALS
    from_file = summarize_job(run_file, {}).report
    from_folder = summarize_job(folder, {}).report
    assert from_file == expected  # the same numbers as the table `terminus-env eval` prints, end reasons included
    assert with_ci(from_folder.overall) == with_ci(expected.overall) and from_folder.overall == expected.overall
    assert from_folder.k == expected.k and [t.task for t in from_folder.tasks] == [t.task for t in expected.tasks]
    for ours, theirs in zip(from_folder.tasks, expected.tasks):
        if ours.task != BROKEN_TASK:  # a job folder does not say at which stage a broken task failed
            assert ours == theirs
    broken = next(t for t in from_folder.tasks if t.task == BROKEN_TASK)
    assert broken.trials == 0 and broken.invalid == TRIALS and broken.end_reasons == {"TaskError": TRIALS}


def test_the_summary_names_the_masked_and_tampered_trials_and_counts_format_errors(synthetic: Synthetic) -> None:
    summary = summarize_job(open_job(synthetic.run_file), {})
    rollouts = synthetic.rollouts
    masked = {t.name: t for t in summary.masked}
    env_errors = {f"{r.task}__{r.trial}" for r in rollouts if r.env_error}
    assert set(masked) == env_errors | {f"{BROKEN_TASK}__{n}" for n in range(TRIALS)} and env_errors
    assert all(masked[name].masked.startswith("SandboxError: the container did not start") for name in env_errors)
    assert masked[f"{BROKEN_TASK}__0"].masked == "TaskError: task.toml: Expected '=' (line 1)"
    assert masked[f"{BROKEN_TASK}__0"].end_reason == "load_error"
    flagged = {f"{r.task}__{r.trial}" for r in rollouts if (r.summary or {}).get("tampering")}
    assert {t.name for t in summary.tampered} == flagged and flagged
    assert all(t.tampering == (TAMPER_FINDING,) and t.reward is not None for t in summary.tampered)  # reported
    with_summary = [r.summary for r in rollouts if r.summary]
    assert summary.format_error_counts == {0: sum(1 for s in with_summary if s["format_errors"] == 0),
                                           1: sum(1 for s in with_summary if s["format_errors"] == 1)}  # fmt: skip
    assert summary.metrics.tampered_count == len(flagged)
    one = next(t for t in summary.trials if t.name == f"{rollouts[0].task}__{rollouts[0].trial}")
    assert one.turns == (rollouts[0].summary or {}).get("turns") and one.wall_s == pytest.approx(rollouts[0].wall_s)


def test_view_writes_the_job_page_its_json_and_a_page_per_trial_with_links_that_resolve(
    synthetic: Synthetic, capsys: pytest.CaptureFixture[str]
) -> None:
    assert view(synthetic.job) == 0
    lines = capsys.readouterr().out.splitlines()
    page = synthetic.job / "job.html"
    assert lines[0] == str(page)
    assert lines[1] == f"{TASKS * TRIALS} trial pages in {synthetic.job}; the figures as JSON in " \
                       f"{synthetic.job / 'job.summary.json'}"  # fmt: skip
    data = json.loads((synthetic.job / "job.summary.json").read_text())
    summary = summarize_job(open_job(synthetic.job), {})
    assert data["report"]["overall"]["mean_reward"] == summary.report.overall.mean_reward
    assert len(data["tasks"]) == TASKS and sum(len(t["trials"]) for t in data["tasks"]) == TASKS * TRIALS
    assert data["masked"] == [t.name for t in summary.masked] and data["tampered"] == [t.name for t in summary.tampered]
    for task in data["tasks"]:
        for trial in task["trials"]:
            target = synthetic.job / trial["page"]
            assert target == synthetic.job / trial["name"] / "trajectory.html" and target.is_file()
            assert '<a href="../job.html">← the job</a>' in target.read_text()
    assert outside_of(page) == []
    assert outside_of(synthetic.job / f"{BROKEN_TASK}__0" / "trajectory.html") == []


def test_a_run_file_or_an_output_elsewhere_keeps_the_trial_pages_beside_the_page(
    synthetic: Synthetic, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert view(synthetic.run_file) == 0
    page = synthetic.run_file.with_suffix(".html")
    assert capsys.readouterr().out.splitlines()[0] == str(page)
    trials = page.parent / "run.trials"
    assert len(list(trials.glob("*.html"))) == TASKS * TRIALS
    assert (page.parent / "run.summary.json").is_file()
    elsewhere = tmp_path / "pages" / "overview.html"
    assert view(synthetic.job, "--output", elsewhere) == 0  # the option's former name, for one release
    assert "--output is now --page" in capsys.readouterr().err
    data = json.loads((tmp_path / "pages" / "overview.summary.json").read_text())
    first = data["tasks"][0]["trials"][0]
    assert first["page"] == f"overview.trials/{first['name']}.html"
    assert '<a href="../overview.html">' in (elsewhere.parent / first["page"]).read_text()
    assert not (synthetic.job / "overview.html").exists()


def test_the_trial_page_shows_the_verifier_files_and_the_tamper_findings(synthetic: Synthetic) -> None:
    flagged = next(r for r in synthetic.rollouts if (r.summary or {}).get("tampering"))
    assert view(synthetic.job, "--trial", f"{flagged.task}__{flagged.trial}") == 0
    text = (synthetic.job / f"{flagged.task}__{flagged.trial}" / "trajectory.html").read_text()
    assert "Flagged for tampering:" in text and "/app/conftest.py" in text and "a pytest plugin the agent wrote" in text
    assert "reward.txt: <code>" in text and "test session starts" in text


def test_one_unreadable_trial_loses_its_figures_not_the_page(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    made = write_synthetic_job(tmp_path, tasks=3, trials=2, broken=False)
    torn = made.job / "task-000__1" / "result.json"
    torn.write_text(torn.read_text()[:100])
    (made.job / "task-001__0" / "agent" / "trajectory.json").write_text("{ not json")
    assert view(made.job) == 0
    captured = capsys.readouterr()
    assert "task-001__0:" in captured.err and "not readable JSON" in captured.err
    data = json.loads((made.job / "job.summary.json").read_text())
    rows = {t["name"]: t for task in data["tasks"] for t in task["trials"]}
    torn_row = rows["task-000__1"]["masked"]
    assert torn_row.startswith("UnreadableResult: ") and "not readable JSON" in torn_row
    assert (made.job / "task-001__0" / "trajectory.html").is_file() and rows["task-001__0"]["masked"] is None


def test_view_refuses_what_it_cannot_show_and_says_what_to_pass(
    synthetic: Synthetic, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert view(synthetic.job, "--page", tmp_path) == 2
    assert f"--page {tmp_path} is a folder; pass the page's file" in capsys.readouterr().err
    log = tmp_path / "steps.jsonl"
    StepLog(log).add(strict_training_steps(1, 4)[0])
    assert view(log, "--trial", "x__0") == 2
    assert "is a training run's step log: it has steps, not trials; drop --trial" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert view(empty) == 2
    assert "not an eval run file (.jsonl), a training run's step log (.jsonl), a Harbor job folder or a trial folder" \
        in capsys.readouterr().err  # fmt: skip


def test_a_step_record_counts_each_batch_as_the_trainers_and_the_eval_count_it() -> None:
    batch = strict_training_steps(1, 40, seed=5)[0]
    record = step_record(3, batch, extra={"rollout_s": 12.5})
    ran = [t for t in batch if t.summary is not None]
    scored = [t for t in ran if not t.masked]
    assert record.step == 3 and record.episodes == len(batch) and record.extra == {"rollout_s": 12.5}
    assert record.end_reasons == {reason: sum(1 for t in ran if t.summary.end_reason == reason)  # type: ignore[union-attr]
                                  for reason in record.end_reasons} | {"env_error": len(batch) - len(ran)}  # fmt: skip
    assert sum(record.end_reasons.values()) == len(batch)
    assert record.mean_reward == pytest.approx(sum(t.reward for t in scored) / len(scored))
    assert record.tampered == sum(1 for t in scored if t.summary.tampering)  # type: ignore[union-attr]
    expected_prompt = sum(sum(turn.prompt_tokens for turn in t.turns) for t in scored) / len(scored)
    assert record.mean_prompt_tokens == pytest.approx(expected_prompt)
    assert record.masked == len(batch) - len(ran) and record.mask_reasons == {"no_episode": record.masked}
    timed = step_record(3, batch, MaskingPolicy(time_limits=TimeLimitEnds.MASKED))
    assert timed.masked == record.masked + record.end_reasons.get(EndReason.AGENT_TIMEOUT, 0)
    assert record.share("format_error") == record.end_reasons.get("format_error", 0) / len(batch)


def test_a_step_log_reads_back_whole_lines_and_refuses_a_bad_one(tmp_path: Path) -> None:
    log = StepLog(tmp_path / "run" / "steps.jsonl")
    batches = strict_training_steps(3, 6)
    written = [log.add(batch) for batch in batches]
    assert [r.step for r in written] == [1, 2, 3]
    assert is_step_log(log.path) and not is_step_log(tmp_path / "missing.jsonl")
    assert read_step_log(log.path) == written
    with log.path.open("a") as handle:
        handle.write('{"kind": "training_step", "ver')  # a crash mid-line
    assert read_step_log(log.path) == written
    lines = log.path.read_text().splitlines()
    log.path.write_text("\n".join([lines[0], "[]", *lines[1:]]) + "\n")
    with pytest.raises(StepLogError, match=r"steps.jsonl:2: not a training step record"):
        read_step_log(log.path)


def test_view_writes_the_training_run_page_and_its_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = StepLog(tmp_path / "steps.jsonl")
    for batch in strict_training_steps(12, 16):
        log.add(batch)
    assert view(log.path) == 0
    data_file = tmp_path / "steps.summary.json"
    assert capsys.readouterr().out.splitlines() == [str(tmp_path / "steps.html"),
                                                    f"12 steps; the figures as JSON in {data_file}"]  # fmt: skip
    data = json.loads(data_file.read_text())
    steps = read_step_log(log.path)
    assert data == json.loads(json.dumps(summarize_training("steps", str(log.path), steps).as_dict()))
    assert [s["step"] for s in data["steps"]] == list(range(1, 13))
    first, last = data["steps"][0], data["steps"][-1]
    assert first["end_reason_shares"]["format_error"] > last["end_reason_shares"]["format_error"]  # strict mode's curve
    assert sum(first["end_reason_shares"].values()) == pytest.approx(1.0)
    page = tmp_path / "steps.html"
    assert outside_of(page) == []
    text = page.read_text()
    assert text.count('<figure class="chart"') == 6 and text.count("<tr>") == 13


def test_the_charts_draw_one_step_gaps_and_round_axes() -> None:
    assert _ticks(1.0) == [0.0, 0.25, 0.5, 0.75, 1.0] and _ticks(0.07) == [0.0, 0.02, 0.04, 0.06, 0.08]
    assert _ticks(0.0) == [0.0, 1.0] and _ticks(3600)[-1] >= 3600
    lone = stacked_shares([5.0], [Series("a", "#000", (0.25,)), Series("b", "#fff", (0.75,))], title="t", name="n")
    assert lone.count("<polygon") == 2
    gappy = line_chart([1, 2, 3, 4], [Series("s", "#000", (1.0, None, 2.0, 3.0))], title="t", name="n")
    assert gappy.count("<polyline") == 2 and gappy.count("<circle") == 3  # the line breaks where a step has none
    many = line_chart(list(range(500)), [Series("s", "#000", tuple(random.Random(1).random() for _ in range(500)))],
                      title="t", name="n")  # fmt: skip
    assert many.count("<polyline") == 1 and "<circle" not in many
