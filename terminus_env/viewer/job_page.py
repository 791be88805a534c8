"""A job's page: the score as the eval prints it, how the trials ended, and a table of the tasks whose every trial is a
coloured mark that opens the trial's own page; the format errors, the trials flagged for tampering, the masked ones.

One self-contained file (:mod:`terminus_env.viewer.style`); the table sorts and filters with a few lines of inline
script, offline. Pure: a :class:`JobSummary` in, the page's text out.
"""

from __future__ import annotations

from collections.abc import Sequence

from terminus_env.records import stats
from terminus_env.records.report import with_ci
from terminus_env.viewer.charts import Bar, bar_chart
from terminus_env.viewer.job_summary import JobSummary, TaskRow, TrialRow
from terminus_env.viewer.style import document, e, end_color, end_meaning, number, percent

DETAIL_CAP = 300
"""Characters of a trial's failure shown in its mark's tooltip (its page has all of it)."""

_STYLE = """
.controls { display: flex; flex-wrap: wrap; gap: .5rem 1rem; align-items: center; margin: .25rem 0 .75rem; }
.controls input, .controls select { font: inherit; padding: .2rem .4rem; }
.mark { display: inline-block; width: .95rem; height: .95rem; border: 2px solid var(--c); border-radius: .2rem;
        margin: 0 .2rem .2rem 0; box-sizing: border-box; vertical-align: middle; background: #fff; }
.mark.solved { background: var(--c); } .mark.no-reward { border-style: dashed; } .mark.dim { opacity: .15; }
.mark:focus, .mark:hover { outline: 2px solid #0969da; outline-offset: 1px; }
.legend .mark { margin-right: .3rem; }
ul.flagged { padding-left: 1.25rem; } ul.flagged li { margin: .3rem 0; }
"""

_SCRIPT = """
(() => {
  const table = document.getElementById("tasks"), body = table.tBodies[0], rows = Array.from(body.rows);
  const task = document.getElementById("filter-task"), reward = document.getElementById("filter-reward");
  const reason = document.getElementById("filter-reason"), shown = document.getElementById("shown");
  function apply() {
    const text = task.value.trim().toLowerCase(), solved = reward.value, ending = reason.value;
    let count = 0;
    for (const row of rows) {
      const keep = row.dataset.task.toLowerCase().includes(text) && (!solved || row.dataset.solved === solved)
        && (!ending || row.dataset.reasons.split(" ").includes(ending));
      row.hidden = !keep;
      count += keep;
      for (const mark of row.querySelectorAll(".mark")) {
        mark.classList.toggle("dim", Boolean(ending) && mark.dataset.reason !== ending);
      }
    }
    shown.textContent = `${count} of ${rows.length} tasks shown`;
  }
  for (const control of [task, reward, reason]) {
    control.addEventListener("input", apply);
    control.addEventListener("change", apply);
  }
  table.tHead.addEventListener("click", (event) => {
    const header = event.target.closest("th[data-sort]");
    if (!header) return;
    const column = header.cellIndex, ascending = header.getAttribute("aria-sort") !== "ascending";
    for (const other of table.tHead.querySelectorAll("th")) other.removeAttribute("aria-sort");
    header.setAttribute("aria-sort", ascending ? "ascending" : "descending");
    const numeric = header.dataset.sort === "number", key = (row) => row.cells[column].dataset.v;
    rows.sort((a, b) => {
      const x = key(a), y = key(b);
      if (x === "" || y === "") return (x === "") - (y === "");  // no figure: last, either way
      const order = numeric ? Number(x) - Number(y) : x.localeCompare(y);
      return ascending ? order : -order;
    });
    body.append(...rows);
  });
  apply();
})();
"""

SOLVED_CLASSES = {
    "all": "every valid trial solved",
    "some": "some trials solved",
    "none": "no trial solved",
    "unscored": "no valid trial",
}
"""The reward filter's choices: each task row is one of them, by its solved trials."""


def render_job(summary: JobSummary, *, data_file: str | None = None) -> str:
    """The job's page; ``data_file`` names the JSON summary written beside it."""
    report = summary.report
    about = [summary.kind, summary.source]
    if summary.agent:
        about.append(f"agent {summary.agent}" + (f", model {summary.model}" if summary.model else ""))
    about.append(f"{len(report.tasks)} tasks × {report.k} trials")
    body = [
        f"<h1>{e(summary.name)}</h1>",
        f'<p class="source">{e(" · ".join(about))}</p>',
        _cards(summary),
        _endings(summary),
        _tasks(summary),
        _format_errors(summary),
        _tampering(summary),
        _masked(summary),
        _categories(report),
    ]
    if data_file:
        body.append(f'<p class="muted">The same figures as JSON, for a dashboard of your own: '
                    f"<code>{e(data_file)}</code> beside this page.</p>")  # fmt: skip
    return document(f"{summary.name}: the job", "\n".join(part for part in body if part), style=_STYLE, script=_SCRIPT)


def _cards(summary: JobSummary) -> str:
    report, metrics, overall = summary.report, summary.metrics, summary.report.overall
    cards = [
        ("score ± 95% CI", with_ci(overall), f"over {overall.tasks} tasks, as the leaderboard computes it"),
        ("pass@1", number(overall.pass_at_1), ""),
    ]
    if report.k > 1:
        cards.append((f"pass@{report.k}", number(overall.pass_at_k), f"over the {overall.pass_at_k_tasks} tasks with "
                      f"{report.k} valid trials"))  # fmt: skip
    cards += [
        ("rollouts", str(report.rollouts), f"{report.invalid} invalid (left out of the score)"),
        ("format errors / rollout", number(metrics.mean_format_errors, 2),
         f"opening streak {metrics.mean_opening_streak:.2f} · rescued {metrics.rescued_count}"),
        ("tampered", percent(metrics.tamper_rate), f"{metrics.tampered_count} of the scored rollouts"),
        ("masked", str(len(summary.masked)), "no reward counts"),
    ]  # fmt: skip
    items = [f'<li class="card" data-card="{e(label)}"><span class="label">{e(label)}</span>'
             f'<span class="value">{e(value)}</span>' + (f' <span class="extra">{e(extra)}</span>' if extra else "")
             + "</li>" for label, value, extra in cards]  # fmt: skip
    notes = []
    if overall.mean_reward is not None and overall.stderr is None:
        notes.append("No confidence interval: it needs 2 valid trials of every task.")
    if overall.unscored:
        notes.append(f"Not scored (no valid trial): {', '.join(overall.unscored)}.")
    return f'<ul class="cards">{"".join(items)}</ul>' + "".join(f'<p class="muted">{e(n)}</p>' for n in notes)


def _endings(summary: JobSummary) -> str:
    total = sum(summary.report.end_reasons.values()) or 1
    bars = [Bar(reason, count, end_color(reason), f"{count} · {percent(count / total)}", end_meaning(reason))
            for reason, count in summary.report.end_reasons.items()]  # fmt: skip
    chart = bar_chart(bars, title="How the trials ended", name="end-reasons")
    return f'<section id="endings"><h2>How the trials ended</h2>{chart}</section>'


def _tasks(summary: JobSummary) -> str:
    k = summary.report.k
    reasons = list(summary.report.end_reasons)
    options = "".join(f'<option value="{e(r)}">{e(r)}</option>' for r in reasons)
    solved = "".join(f'<option value="{key}">{e(text)}</option>' for key, text in SOLVED_CLASSES.items())
    controls = (
        '<div class="controls"><label>Task <input id="filter-task" type="search" placeholder="part of its name">'
        f'</label><label>Solved <select id="filter-reward"><option value="">any</option>{solved}</select></label>'
        f'<label>End reason <select id="filter-reason"><option value="">any</option>{options}</select></label>'
        '<span id="shown" class="muted"></span></div>'
    )
    legend = (
        '<p class="legend"><span><span class="mark solved" style="--c:#555"></span>solved</span>'
        '<span><span class="mark" style="--c:#555"></span>not solved</span>'
        '<span><span class="mark no-reward" style="--c:#555"></span>no reward (masked)</span>'
        "<span>colour: the end reason; each mark opens its trial</span></p>"
    )
    headers = [("task", "text", ""), ("trials", "number", "n"), ("mean reward", "number", "n")]
    if k > 1:
        headers.append((f"pass@{k}", "number", "n"))
    headers += [("trials, by end reason", "", ""), ("format errors", "number", "n"), ("turns", "number", "n"),
                ("tokens in / out", "number", "n"), ("wall s", "number", "n")]  # fmt: skip
    head = "".join(f'<th class="{cls}"' + (f' data-sort="{kind}"' if kind else "") + f">{e(name)}</th>"
                   for name, kind, cls in headers)  # fmt: skip
    rows = "\n".join(_task_row(task, k) for task in summary.tasks)
    return (f'<section id="task-table"><h2>Tasks</h2>{controls}{legend}<table id="tasks"><thead><tr>{head}</tr>'
            f"</thead><tbody>\n{rows}\n</tbody></table></section>")  # fmt: skip


def _task_row(task: TaskRow, k: int) -> str:
    score = task.score
    if score.trials == 0:
        solved = "unscored"
    else:
        solved = "all" if score.solved == score.trials else "some" if score.solved else "none"
    reasons = " ".join(dict.fromkeys(t.end_reason for t in task.trials))
    trials = f"{score.trials}" + (f" (+{score.invalid} invalid)" if score.invalid else "")
    tokens = None
    if task.mean_tokens_in is not None or task.mean_tokens_out is not None:
        tokens = (task.mean_tokens_in or 0) + (task.mean_tokens_out or 0)
    cells = [
        _cell(task.task, task.task),
        _cell(trials, score.trials, "n"),
        _cell(number(score.mean_reward), score.mean_reward, "n"),
    ]
    if k > 1:
        cells.append(_cell(number(score.pass_at_k), score.pass_at_k, "n"))
    cells += [
        f'<td class="marks">{"".join(_mark(t) for t in task.trials)}</td>',
        _cell(str(task.format_errors), task.format_errors, "n"),
        _cell(number(task.mean_turns, 1), task.mean_turns, "n"),
        _cell(f"{number(task.mean_tokens_in, 0)} / {number(task.mean_tokens_out, 0)}", tokens, "n"),
        _cell(number(task.mean_wall_s, 1), task.mean_wall_s, "n"),
    ]
    return (f'<tr data-task="{e(task.task)}" data-solved="{solved}" data-reasons="{e(reasons)}">'
            + "".join(cells) + "</tr>")  # fmt: skip


def _cell(text: str, value: object, cls: str = "") -> str:
    sort = "" if value is None else value
    return f'<td class="{cls}" data-v="{e(sort)}">{e(text)}</td>'


def _mark(trial: TrialRow) -> str:
    state = "solved" if trial.solved else "no-reward" if trial.reward is None else "unsolved"
    facts = [trial.name, trial.end_reason, "no reward" if trial.reward is None else f"reward {trial.reward:g}"]
    if trial.turns is not None:
        facts.append(f"{trial.turns} turns")
    if trial.format_errors:
        facts.append(f"{trial.format_errors} format errors")
    if trial.wall_s is not None:
        facts.append(f"{trial.wall_s:.1f} s")
    if trial.tampering:
        facts.append("flagged for tampering")
    tip = " · ".join(facts)
    why = trial.masked or (None if trial.solved else trial.detail)
    if why:
        tip += f"\n{why[:DETAIL_CAP]}{'…' if len(why) > DETAIL_CAP else ''}"
    return (f'<a class="mark {state}" href="{e(trial.page)}" data-trial="{e(trial.name)}" '
            f'data-reason="{e(trial.end_reason)}" style="--c:{end_color(trial.end_reason)}" title="{e(tip)}"></a>'
            )  # fmt: skip


def _format_errors(summary: JobSummary) -> str:
    metrics, counts = summary.metrics, summary.format_error_counts
    text = (f"{metrics.mean_format_errors:.2f} format errors per rollout, over the {sum(counts.values())} rollouts "
            f"with an episode summary; an opening streak of {metrics.mean_opening_streak:.2f} rejected turns before "
            f"the first accepted one; {metrics.rescued_count} rollouts rescued (a format error, then a reward)."
            )  # fmt: skip
    if not counts:
        return f'<section id="format-errors"><h2>Format errors</h2><p class="muted">{e(text)}</p></section>'
    total = sum(counts.values())
    bars = [Bar(f"{n} format error{'' if n == 1 else 's'}", count, "#cf222e" if n else "#1a7f37",
                f"{count} rollouts · {percent(count / total)}") for n, count in counts.items()]  # fmt: skip
    chart = bar_chart(bars, title="Rollouts by their format errors", name="format-errors")
    return f'<section id="format-errors"><h2>Format errors</h2><p>{e(text)}</p>{chart}</section>'


def _tampering(summary: JobSummary) -> str:
    metrics, flagged = summary.metrics, summary.tampered
    head = (f"{metrics.tampered_count} of the scored rollouts ({percent(metrics.tamper_rate)}) ran a verifier the "
            "agent had changed (in evaluation their rewards stand and are only reported; in training they end "
            "tampered, reward 0).")  # fmt: skip
    items = []
    for trial in flagged:
        findings = "; ".join(" ".join(str(f.get(key, "")) for key in ("kind", "path")).strip()
                             + (f": {f['detail']}" if f.get("detail") else "") for f in trial.tampering)  # fmt: skip
        reward = "no reward" if trial.reward is None else f"reward {trial.reward:g}"
        items.append(f'<li><a href="{e(trial.page)}">{e(trial.name)}</a> ({e(trial.end_reason)}, {reward}): '
                     f"<code>{e(findings)}</code></li>")  # fmt: skip
    listing = f'<ul class="flagged">{"".join(items)}</ul>' if items else '<p class="muted">None flagged.</p>'
    return f'<section id="tampering"><h2>Tampering</h2><p>{e(head)}</p>{listing}</section>'


def _masked(summary: JobSummary) -> str:
    masked = summary.masked
    head = (f"{len(masked)} trials have no reward that counts: the infrastructure failed, their task never ran, or "
            "their grade can be neither trusted nor blamed on the agent. The score leaves them out; a trainer "
            "masks them.")  # fmt: skip
    items = [f'<li><a href="{e(t.page)}">{e(t.name)}</a> ({e(t.end_reason)}): {e(t.masked)}</li>' for t in masked]
    listing = f'<ul class="flagged">{"".join(items)}</ul>' if items else '<p class="muted">None.</p>'
    return f'<section id="masked"><h2>Masked</h2><p>{e(head)}</p>{listing}</section>'


def _categories(report: stats.Report) -> str:
    groups = [(name, score) for name, score in report.categories.items() if score.tasks and name != "-"]
    if len(groups) < 2:
        return ""
    k = report.k
    rows = "".join(
        f"<tr><td>{e(name)}</td><td class=n>{score.tasks}</td><td class=n>{number(score.pass_at_1)}</td>"
        + (f"<td class=n>{number(score.pass_at_k)}</td>" if k > 1 else "")
        + f"<td class=n>{e(with_ci(score))}</td></tr>"
        for name, score in [*groups, ("overall", report.overall)]
    )  # fmt: skip
    head = _heads(["category", "tasks", "pass@1", *([f"pass@{k}"] if k > 1 else []), "mean reward ± 95% CI"])
    return f'<section id="categories"><h2>By category</h2><table><thead><tr>{head}</tr></thead>{rows}</table></section>'


def _heads(names: Sequence[str]) -> str:
    return "".join(f'<th class="{"" if i == 0 else "n"}">{e(name)}</th>' for i, name in enumerate(names))
