"""Small server-rendered SVG charts for the admin: pure functions, data in, an SVG string out.

The admin's Content-Security-Policy allows no script and no third-party origin, so charts are
drawn on the server and sent inline in the page. Every piece of text (labels, titles, series
names) is escaped here, so callers may mark the result safe. Hovering a bar or a point shows its
value through SVG `<title>` elements: no script needed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from html import escape

Number = int | float | Decimal

WIDTH, HEIGHT = 640, 180
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 70, 12, 24, 34
AXIS, GRID, TEXT = "#767676", "#dddddd", "#333333"


@dataclass(frozen=True, slots=True)
class Series:
    name: str
    values: Sequence[float | None]  # one per label; None leaves a gap
    colour: str


def _fmt(value: Number) -> str:
    """Short human numbers for axes: 1.2k, 3.4M; below 1000 up to 4 significant figures."""
    v = float(value)
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= factor:
            return f"{v / factor:.3g}{suffix}"
    return f"{v:.4g}"


def _nice_ceiling(value: float) -> float:
    """The smallest 1, 2, 2.5 or 5 × 10^n at or above `value`, so the top gridline reads well."""
    if value <= 0:
        return 1.0
    exponent = math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        candidate = step * 10**exponent
        if candidate >= value * (1 - 1e-12):
            return float(candidate)
    return float(10 ** (exponent + 1))


def _frame(title: str, body: list[str]) -> str:
    label = escape(title)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="tessera-chart" role="img" aria-label="{label}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
        f'font-family="sans-serif" font-size="11" style="max-width:100%;height:auto">'
        f"<title>{label}</title>"
        f'<text x="{MARGIN_LEFT}" y="14" fill="{TEXT}" font-weight="bold">{label}</text>'
        + "".join(body)
        + "</svg>"
    )


def _empty(title: str) -> str:
    return _frame(title, [f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" fill="{AXIS}" text-anchor="middle">'
                          "No data in this period</text>"])


def _axes(labels: Sequence[str], y_min: float, y_max: float, y_format: Callable[[float], str]) -> list[str]:
    """Gridlines with their values on the left, and every few x labels along the bottom."""
    plot_h = HEIGHT - MARGIN_TOP - MARGIN_BOTTOM
    parts = []
    for i in range(5):
        value = y_min + (y_max - y_min) * i / 4
        y = MARGIN_TOP + plot_h * (1 - i / 4)
        parts.append(f'<line x1="{MARGIN_LEFT}" y1="{y:.1f}" x2="{WIDTH - MARGIN_RIGHT}" y2="{y:.1f}" '
                     f'stroke="{GRID if i else AXIS}"/>')
        parts.append(f'<text x="{MARGIN_LEFT - 6}" y="{y + 4:.1f}" fill="{TEXT}" text-anchor="end">'
                     f"{escape(y_format(value))}</text>")
    n = len(labels)
    every = max(1, math.ceil(n / 8))  # at most ~8 labels: a month of days stays legible
    slot = (WIDTH - MARGIN_LEFT - MARGIN_RIGHT) / max(n, 1)
    for i, label in enumerate(labels):
        # every `every`-th label, and the last one, unless it would sit on top of its neighbour
        if (i % every == 0 and n - 1 - i >= every / 2) or i == n - 1:
            x = MARGIN_LEFT + slot * (i + 0.5)
            parts.append(f'<text x="{x:.1f}" y="{HEIGHT - MARGIN_BOTTOM + 16}" fill="{TEXT}" '
                         f'text-anchor="middle">{escape(label)}</text>')
    return parts


def bar_chart(*, title: str, labels: Sequence[str], values: Sequence[Number], colour: str = "#417690",
              unit: str = "", value_format: Callable[[Number], str] = _fmt) -> str:
    """One bar per label (e.g. tokens per day). Negative values are drawn as zero-height bars."""
    if len(labels) != len(values):
        raise ValueError(f"values: need one per label, got {len(values)} for {len(labels)} labels")
    if not labels or not any(float(v) > 0 for v in values):
        return _empty(title)
    y_max = _nice_ceiling(max(float(v) for v in values))
    plot_w, plot_h = WIDTH - MARGIN_LEFT - MARGIN_RIGHT, HEIGHT - MARGIN_TOP - MARGIN_BOTTOM
    slot = plot_w / len(labels)
    parts = _axes(labels, 0.0, y_max, lambda v: _fmt(v))
    suffix = f" {unit}" if unit else ""
    for i, (label, value) in enumerate(zip(labels, values, strict=True)):
        h = plot_h * max(float(value), 0.0) / y_max
        x = MARGIN_LEFT + slot * i + slot * 0.15
        y = MARGIN_TOP + plot_h - h
        tip = escape(f"{label}: {value_format(value)}{suffix}")
        parts.append(f'<rect class="bar" x="{x:.1f}" y="{y:.1f}" width="{slot * 0.7:.1f}" height="{h:.1f}" '
                     f'fill="{escape(colour)}"><title>{tip}</title></rect>')
    return _frame(title, parts)


def line_chart(*, title: str, labels: Sequence[str], series: Sequence[Series], y_min: float | None = None,
               y_max: float = 1.0, reference: float | None = None, reference_label: str = "objective",
               value_format: Callable[[float], str] = lambda v: f"{v:.2%}") -> str:
    """Lines over labels (e.g. daily attainment per SLI), with an optional dashed reference (the objective).

    `y_min` None: just below the lowest value or the reference, so 99.5% and 99.9% do not sit on one line.
    """
    for s in series:
        if len(s.values) != len(labels):
            raise ValueError(f"series {s.name!r}: need one value per label, got {len(s.values)} for {len(labels)}")
    points = [v for s in series for v in s.values if v is not None]
    if not labels or not points:
        return _empty(title)
    if y_min is None:
        lowest = min([*points, *([reference] if reference is not None else [])])
        y_min = max(0.0, math.floor((lowest - (y_max - lowest) * 0.25 - 1e-9) * 100) / 100)
    if y_min >= y_max:
        y_min = y_max - 1.0
    plot_w, plot_h = WIDTH - MARGIN_LEFT - MARGIN_RIGHT, HEIGHT - MARGIN_TOP - MARGIN_BOTTOM
    slot = plot_w / len(labels)

    def y_of(value: float) -> float:
        clamped = min(max(value, y_min), y_max)
        return MARGIN_TOP + plot_h * (1 - (clamped - y_min) / (y_max - y_min))

    parts = _axes(labels, y_min, y_max, value_format)
    if reference is not None:
        y = y_of(reference)
        parts.append(f'<line class="reference" x1="{MARGIN_LEFT}" y1="{y:.1f}" x2="{WIDTH - MARGIN_RIGHT}" '
                     f'y2="{y:.1f}" stroke="#c62828" stroke-dasharray="4 3">'
                     f"<title>{escape(f'{reference_label}: {value_format(reference)}')}</title></line>")
    for index, s in enumerate(series):
        colour = escape(s.colour)
        run: list[str] = []
        runs: list[list[str]] = []
        for i, value in enumerate(s.values):
            if value is None:  # no traffic that day: a gap, not a dip to zero
                if run:
                    runs.append(run)
                run = []
                continue
            x, y = MARGIN_LEFT + slot * (i + 0.5), y_of(value)
            run.append(f"{x:.1f},{y:.1f}")
            parts.append(f'<circle class="point" cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{colour}">'
                         f"<title>{escape(f'{s.name} {labels[i]}: {value_format(value)}')}</title></circle>")
        if run:
            runs.append(run)
        for r in runs:
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{" ".join(r)}"/>')
        lx = WIDTH - MARGIN_RIGHT - (len(series) - index) * 110  # legend on the right, clear of the title
        parts.append(f'<rect x="{lx}" y="6" width="10" height="10" fill="{colour}"/>'
                     f'<text x="{lx + 14}" y="15" fill="{TEXT}">{escape(s.name)}</text>')
    return _frame(title, parts)
