"""Charts as inline SVG: horizontal bars, lines over training steps, and shares stacked over steps.

Written here rather than taken from a charting library: the pages need three plain kinds of chart, and an offline
library would put hundreds of kilobytes of script into every page (or into the wheel) for them. Each chart is one
``<figure>`` of SVG and an HTML legend; a value's exact figure is in its tooltip (an SVG ``<title>``) and in the
page's tables. Pure: numbers in, markup out; every text is escaped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from terminus_env.viewer.style import e

WIDTH = 760
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 12, 30
"""The plot's margins: the y axis' labels on the left, the x axis' below."""
HEIGHT = 220
BAR_ROW = 24
BAR_LABEL = 170
"""The width the bars' labels take, left of the bars."""
MAX_POINTS = 60
"""Above this many steps a line is drawn without a dot (and its tooltip) per step: the table has the figures."""


@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    color: str
    note: str = ""
    """Written after the bar (its count and share, say)."""
    hint: str = ""
    """The tooltip: what the bar means."""


@dataclass(frozen=True)
class Series:
    label: str
    color: str
    values: tuple[float | None, ...]
    """One per step; None where the step has no figure."""


def bar_chart(bars: Sequence[Bar], *, title: str, name: str) -> str:
    """Horizontal bars, longest value full width."""
    top = max((bar.value for bar in bars), default=0.0) or 1.0
    room = WIDTH - BAR_LABEL - 150
    height = BAR_ROW * len(bars) + 8
    parts = []
    for index, bar in enumerate(bars):
        y = 4 + index * BAR_ROW
        width = room * bar.value / top
        tip = f"{bar.label}: {bar.note}" + (f". {bar.hint}" if bar.hint else "")
        parts.append(
            f'<g class="bar" data-label="{e(bar.label)}"><title>{e(tip)}</title>'
            f'<text x="{BAR_LABEL - 8}" y="{y + 15}" text-anchor="end">{e(bar.label)}</text>'
            f'<rect x="{BAR_LABEL}" y="{y + 3}" width="{width:.1f}" height="{BAR_ROW - 8}" rx="2" '
            f'fill="{e(bar.color)}"/>'
            f'<text x="{BAR_LABEL + width + 6:.1f}" y="{y + 15}">{e(bar.note)}</text></g>'
        )
    return _figure(name, title, height, "".join(parts), "")


def line_chart(
    steps: Sequence[float], series: Sequence[Series], *, title: str, name: str, percent: bool = False,
    y_max: float | None = None,
) -> str:  # fmt: skip
    """Each series as a line over the steps; the y axis starts at 0."""
    values = [v for s in series for v in s.values if v is not None]
    ticks = _ticks(y_max if y_max is not None else max(values, default=0.0))
    label = _percent if percent else _short
    x_of = _x_scale(steps)
    y_of = _y_scale(ticks[-1])
    parts = [_y_axis(ticks, y_of, label), _x_axis(steps, x_of)]
    for s in series:
        for run in _runs(steps, s.values):
            points = " ".join(f"{x_of(x):.1f},{y_of(v):.1f}" for x, v in run)
            parts.append(f'<polyline class="line" data-series="{e(s.label)}" points="{points}" fill="none" '
                         f'stroke="{e(s.color)}" stroke-width="2"><title>{e(s.label)}</title></polyline>')  # fmt: skip
        if len(steps) <= MAX_POINTS:
            for x, v in zip(steps, s.values):
                if v is not None:
                    parts.append(f'<circle cx="{x_of(x):.1f}" cy="{y_of(v):.1f}" r="3" fill="{e(s.color)}">'
                                 f"<title>{e(f'{s.label}, step {x:g}: {label(v)}')}</title></circle>")  # fmt: skip
    return _figure(name, title, HEIGHT, "".join(parts), _legend((s.label, s.color) for s in series))


def stacked_shares(steps: Sequence[float], layers: Sequence[Series], *, title: str, name: str) -> str:
    """Shares of a whole per step (each step's values sum to 1), stacked: each step a column as wide as its share of
    the axis, each layer one shape across all steps, so thousands of steps stay one path per layer."""
    ticks = [0.0, 0.25, 0.5, 0.75, 1.0]
    y_of = _y_scale(1.0)
    edges = _edges(steps)
    x_of = _x_scale([edges[0], edges[-1]])
    parts = [_y_axis(ticks, y_of, _percent), _x_axis(steps, x_of)]
    below = [0.0] * len(steps)
    for layer in layers:
        above = [low + (v or 0.0) for low, v in zip(below, layer.values)]
        top = [f"{x_of(edges[i]):.1f},{y_of(above[i]):.1f} {x_of(edges[i + 1]):.1f},{y_of(above[i]):.1f}"
               for i in range(len(steps))]  # fmt: skip
        bottom = [f"{x_of(edges[i + 1]):.1f},{y_of(below[i]):.1f} {x_of(edges[i]):.1f},{y_of(below[i]):.1f}"
                  for i in reversed(range(len(steps)))]  # fmt: skip
        mean = sum(v or 0.0 for v in layer.values) / len(steps) if steps else 0.0
        tip = f"{layer.label}: {_percent(mean)} of the episodes, over all steps"
        parts.append(f'<polygon class="layer" data-series="{e(layer.label)}" points="{" ".join(top + bottom)}" '
                     f'fill="{e(layer.color)}"><title>{e(tip)}</title></polygon>')  # fmt: skip
        below = above
    return _figure(name, title, HEIGHT, "".join(parts), _legend((s.label, s.color) for s in layers))


def _figure(name: str, title: str, height: int, body: str, legend: str) -> str:
    return (f'<figure class="chart" data-chart="{e(name)}"><svg xmlns="http://www.w3.org/2000/svg" '
            f'viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" role="img" aria-label="{e(title)}">'
            f"<title>{e(title)}</title>{body}</svg>{legend}</figure>")  # fmt: skip


def _legend(entries: Iterable[tuple[str, str]]) -> str:
    items = "".join(f'<span><span class="swatch" style="background:{e(color)}"></span>{e(label)}</span>'
                    for label, color in entries)  # fmt: skip
    return f'<figcaption class="legend">{items}</figcaption>'


def _y_axis(ticks: Sequence[float], y_of: Callable[[float], float], label: Callable[[float], str]) -> str:
    lines = []
    for tick in ticks:
        y = y_of(tick)
        lines.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
                     f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{e(label(tick))}</text>')  # fmt: skip
    bottom = HEIGHT - BOTTOM
    return "".join(lines) + f'<line class="axis" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{bottom}" y2="{bottom}"/>'


def _x_axis(steps: Sequence[float], x_of: Callable[[float], float]) -> str:
    if not steps:
        return ""
    low, high = min(steps), max(steps)
    marks = [low] if high == low else [t + low for t in _ticks(high - low, 8) if t + low <= high]
    y = HEIGHT - BOTTOM
    parts = [f'<text x="{x_of(m):.1f}" y="{y + 16}" text-anchor="middle">{e(f"{m:g}")}</text>' for m in marks]
    parts.append(f'<text x="{WIDTH - RIGHT}" y="{HEIGHT - 1}" text-anchor="end" class="muted">step</text>')
    return "".join(parts)


def _x_scale(steps: Sequence[float]) -> Callable[[float], float]:
    low, high = (min(steps), max(steps)) if steps else (0.0, 1.0)
    if high == low:
        return lambda _: (LEFT + WIDTH - RIGHT) / 2
    return lambda x: LEFT + (x - low) / (high - low) * (WIDTH - RIGHT - LEFT)


def _y_scale(top: float) -> Callable[[float], float]:
    return lambda y: HEIGHT - BOTTOM - (y / top if top else 0.0) * (HEIGHT - BOTTOM - TOP)


def _edges(steps: Sequence[float]) -> list[float]:
    """Where each step's column starts and ends: halfway to its neighbours (a lone step spans ±0.5)."""
    if len(steps) < 2:
        middle = steps[0] if steps else 0.0
        return [middle - 0.5, middle + 0.5][: len(steps) + 1]
    middles = [(a + b) / 2 for a, b in zip(steps, steps[1:])]
    return [2 * steps[0] - middles[0], *middles, 2 * steps[-1] - middles[-1]]


def _runs(steps: Sequence[float], values: Sequence[float | None]) -> list[list[tuple[float, float]]]:
    """The stretches of consecutive steps that have a value: a line breaks where a step has none."""
    runs: list[list[tuple[float, float]]] = [[]]
    for x, v in zip(steps, values):
        if v is None:
            runs.append([])
        else:
            runs[-1].append((x, v))
    return [run for run in runs if run]


def _ticks(top: float, count: int = 4) -> list[float]:
    """Round ticks from 0 to at least ``top``: steps of 1, 2, 2.5 or 5 times a power of ten."""
    if top <= 0:
        return [0.0, 1.0]
    raw = top / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    return [i * step for i in range(math.ceil(top / step - 1e-9) + 1)]


def _short(value: float) -> str:
    if abs(value) >= 1000:
        return f"{value / 1000:g}k"
    return f"{round(value, 4):g}"


def _percent(share: float) -> str:
    return f"{100 * share:.1f}".removesuffix(".0") + "%"
