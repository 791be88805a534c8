"""A training run's page: per step, the mean reward, how the episodes ended (the shares of each end reason), the
format errors, turns and tokens, and the tamper and masked rates; then every step's figures in a table.

The shares chart is the curve that shows strict mode at work: ``format_error`` endings (reward 0) fall as the policy
learns the format. One self-contained file, no script (:mod:`terminus_env.viewer.style`). Pure: a
:class:`TrainingSummary` in, the page's text out.
"""

from __future__ import annotations

from terminus_env.viewer.charts import Series, line_chart, stacked_shares
from terminus_env.viewer.style import document, e, end_color, number, percent
from terminus_env.viewer.training_summary import TrainingSummary

COLORS = ("#0969da", "#cf222e", "#1a7f37", "#8250df", "#9a6700")
"""The lines of a chart, in order."""


def render_training(summary: TrainingSummary, *, data_file: str | None = None) -> str:
    """The run's page; ``data_file`` names the JSON summary written beside it."""
    steps = summary.steps
    x = [float(step.step) for step in steps]

    def series(label: str, values: list[float | None], index: int) -> Series:
        return Series(label, COLORS[index], tuple(values))

    charts = [
        ("Mean reward", line_chart(x, [series("mean reward", [s.mean_reward for s in steps], 0)],
                                   title="Mean reward per step", name="reward",
                                   y_max=max(1.0, *(s.mean_reward for s in steps)))),
        ("How the episodes ended", stacked_shares(
            x, [Series(reason, end_color(reason), tuple(s.share(reason) for s in steps))
                for reason in summary.end_reasons],
            title="The share of each end reason per step", name="end-reasons")),
        ("Format errors", line_chart(x, [series("format errors per rollout", [s.mean_format_errors for s in steps], 1),
                                         series("opening streak", [s.mean_opening_streak for s in steps], 3)],
                                     title="Format errors per rollout, per step", name="format-errors")),
        ("Turns", line_chart(x, [series("turns per episode", [s.mean_turns for s in steps], 0)],
                             title="Turns per episode, per step", name="turns")),
        ("Tokens", line_chart(x, [series("prompt tokens per episode", [s.mean_prompt_tokens for s in steps], 0),
                                  series("completion tokens per episode",
                                         [s.mean_completion_tokens for s in steps], 2)],
                              title="Tokens per episode, per step", name="tokens")),
        ("Tampered and masked", line_chart(x, [series("tampered", [s.tamper_rate for s in steps], 4),
                                               series("masked", [s.masked_rate for s in steps], 0)],
                                           title="Tamper and masked rates per step", name="rates", percent=True)),
    ]  # fmt: skip
    first, last = (steps[0], steps[-1]) if steps else (None, None)
    cards = [
        ("steps", str(len(steps)), ""),
        ("episodes", str(summary.episodes), ""),
        ("mean reward", number(last.mean_reward if last else None), f"step {last.step}; step {first.step}: "
         f"{number(first.mean_reward)}" if first and last else ""),
        ("format errors / rollout", number(last.mean_format_errors if last else None, 2), "the last step"),
        ("tampered", str(summary.tampered), "episodes, over the run"),
        ("masked", str(summary.masked), "episodes, over the run"),
    ]  # fmt: skip
    items = "".join(f'<li class="card"><span class="label">{e(label)}</span><span class="value">{e(value)}</span>'
                    + (f' <span class="extra">{e(extra)}</span>' if extra else "") + "</li>"
                    for label, value, extra in cards)  # fmt: skip
    body = [
        f"<h1>{e(summary.name)}</h1>",
        f'<p class="source">training run · {e(summary.source)}</p>',
        f'<ul class="cards">{items}</ul>',
        *(f'<section class="plot"><h2>{e(heading)}</h2>{chart}</section>' for heading, chart in charts),
        _table(summary),
    ]
    if data_file:
        body.append(f'<p class="muted">The same figures as JSON, for a dashboard of your own: '
                    f"<code>{e(data_file)}</code> beside this page.</p>")  # fmt: skip
    return document(f"{summary.name}: the training run", "\n".join(body))


def _table(summary: TrainingSummary) -> str:
    heads = ["step", "episodes", "mean reward", "format errors / rollout", "opening streak", "turns",
             "tokens in / out", "tampered", "masked", "end reasons"]  # fmt: skip
    head = "".join(f'<th class="{"" if name == "end reasons" else "n"}">{e(name)}</th>' for name in heads)
    rows = []
    for s in summary.steps:
        ends = ", ".join(f"{reason} {count}" for reason, count in s.end_reasons.items())
        cells = [str(s.step), str(s.episodes), number(s.mean_reward), number(s.mean_format_errors, 2),
                 number(s.mean_opening_streak, 2), number(s.mean_turns, 1),
                 f"{number(s.mean_prompt_tokens, 0)} / {number(s.mean_completion_tokens, 0)}",
                 f"{s.tampered} ({percent(s.tamper_rate)})", f"{s.masked} ({percent(s.masked_rate)})"]  # fmt: skip
        rows.append("<tr>" + "".join(f'<td class="n">{e(c)}</td>' for c in cells) + f"<td>{e(ends)}</td></tr>")
    return (f'<section id="step-table"><h2>Every step</h2><table id="steps"><thead><tr>{head}</tr></thead><tbody>'
            + "\n".join(rows) + "</tbody></table></section>")  # fmt: skip
