"""What the job's and the training run's pages share: the colour of each end reason, the page's style, escaping.

Every page is one self-contained file: its style and script inline, its charts inline SVG, no font, script, style
sheet or image fetched from anywhere, so it opens offline from disk and can be attached to an issue as it is.
"""

from __future__ import annotations

import html
from typing import Any

from terminus_env.rules import EndReason

END_COLORS: dict[str, str] = {
    EndReason.TASK_COMPLETE: "#1a7f37",
    EndReason.AGENT_TIMEOUT: "#9a6700",
    EndReason.MAX_TURNS: "#d4a72c",
    EndReason.SHELL_LOST: "#8c959f",
    EndReason.FORMAT_ERROR: "#cf222e",
    EndReason.TURN_TRUNCATED: "#fb8f44",
    EndReason.CONTEXT_LIMIT: "#8250df",
    EndReason.RESOURCE_LIMIT: "#953800",
    EndReason.VERIFIER_BROKEN: "#a40e26",
    EndReason.TAMPERED: "#1f2328",
    EndReason.ENV_ERROR: "#0969da",
}
"""One colour per end reason, grouped by meaning: green the task's own end, yellows the limits, reds and orange the
agent's faults, black a tampered verdict, blue the infrastructure's failures."""
OTHER_ERROR = "#54aeff"
"""A trial that never ran (its task did not load or build), or any other error a job names."""
UNKNOWN = "#afb8c1"
"""An ending this package does not name (a trial written by Harbor itself)."""


def end_color(reason: str) -> str:
    if reason in END_COLORS:
        return END_COLORS[reason]
    return OTHER_ERROR if reason.endswith(("_error", "Error")) else UNKNOWN


def end_meaning(reason: str) -> str:
    """What an end reason means, for a tooltip: the rules' own words, or what a page can say of the others."""
    try:
        return EndReason(reason).event.replace("`", "")
    except ValueError:
        pass
    if reason in ("load_error", "image_error"):
        return "the task did not load, or its image did not build: the trial never ran"
    return "an ending this package does not name (the error's type, or a trial Harbor wrote)"


CSS = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 80rem; padding: 1.5rem; color: #1d1d1f;
       background: #fafafa; }
h1 { font-size: 1.5rem; margin: 0 0 .25rem; } h2 { font-size: 1.15rem; margin: 1.75rem 0 .5rem; }
.source { color: #555; margin: 0 0 1rem; word-break: break-all; }
.cards { display: flex; flex-wrap: wrap; gap: .75rem; margin: 0; padding: 0; list-style: none; }
.cards li { background: #fff; border: 1px solid #ddd; border-radius: .5rem; padding: .5rem .9rem; }
.cards .label { display: block; color: #555; font-size: .8rem; text-transform: uppercase; letter-spacing: .04em; }
.cards .value { font-size: 1.25rem; font-weight: 600; } .cards .extra { color: #555; font-size: .85rem; }
section { background: #fff; border: 1px solid #ddd; border-radius: .5rem; padding: .75rem 1.25rem 1rem;
          margin: 1rem 0; }
section > h2 { margin-top: .25rem; }
figure.chart { margin: .5rem 0; } figure.chart svg { max-width: 100%; height: auto; }
svg text { font: 12px system-ui, sans-serif; fill: #333; } svg .axis { stroke: #999; } svg .grid { stroke: #eee; }
.legend { display: flex; flex-wrap: wrap; gap: .25rem 1rem; font-size: .85rem; color: #333; margin: .25rem 0 0; }
.swatch { display: inline-block; width: .8rem; height: .8rem; border-radius: .15rem; margin-right: .3rem;
          vertical-align: -.1rem; }
table { border-collapse: collapse; width: 100%; font-size: .9rem; }
th, td { text-align: left; padding: .3rem .5rem; border-bottom: 1px solid #eee; vertical-align: top; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
th[data-sort] { cursor: pointer; user-select: none; white-space: nowrap; }
th[aria-sort="ascending"]::after { content: " ▲"; } th[aria-sort="descending"]::after { content: " ▼"; }
.muted { color: #666; } .problem { color: #a40e26; }
code, pre { font: 13px/1.35 ui-monospace, monospace; } pre { white-space: pre-wrap; word-break: break-word; }
"""


def e(value: Any) -> str:
    """Escaped for HTML text and attribute values."""
    return html.escape(str(value), quote=True)


def number(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def percent(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f}%"


def document(title: str, body: str, *, style: str = "", script: str = "") -> str:
    """A whole page: its style and script inline."""
    scripts = f"<script>{script}</script>" if script else ""
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{e(title)}</title><style>{CSS}{style}</style></head><body>\n{body}\n{scripts}</body></html>\n"
    )
