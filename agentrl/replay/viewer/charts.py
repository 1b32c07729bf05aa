"""Server-side SVG chart geometry for the run page: line charts whose points are links (a
point opens the episodes behind it, with or without JavaScript) and stacked bar charts.

Pure functions from numbers to coordinates; the templates draw them (``_charts.html``), so
every label goes through Jinja2's autoescaping like the rest of the page.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

WIDTH, HEIGHT = 560, 220
PAD_L, PAD_R, PAD_T, PAD_B = 56, 12, 12, 36
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f")


@dataclass
class Point:
    x: float
    y: float
    cx: float
    cy: float
    label: str
    href: str | None


@dataclass
class Line:
    name: str
    color: str
    points: list[Point]

    @property
    def path(self) -> str:
        return " ".join(f"{p.cx:.1f},{p.cy:.1f}" for p in self.points)


@dataclass
class Tick:
    pos: float
    label: str


@dataclass
class Chart:
    """A chart ready to draw: ``lines`` (line charts) or ``bars`` (stacked), axis ticks."""

    chart_id: str
    title: str
    x_label: str
    y_label: str
    lines: list[Line] = field(default_factory=list)
    bars: list[list["Bar"]] = field(default_factory=list)
    legend: list[tuple[str, str]] = field(default_factory=list)
    x_ticks: list[Tick] = field(default_factory=list)
    y_ticks: list[Tick] = field(default_factory=list)
    width: int = WIDTH
    height: int = HEIGHT

    @property
    def empty(self) -> bool:
        return not any(line.points for line in self.lines) and not self.bars

    @property
    def plot(self) -> tuple[int, int, int, int]:
        return PAD_L, PAD_T, self.width - PAD_R, self.height - PAD_B


@dataclass
class Bar:
    x: float
    y: float
    w: float
    h: float
    color: str
    label: str
    href: str | None


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values covering ``[lo, hi]``."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(1, n)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    out, v = [], start
    while len(out) < 50:
        if out and out[-1] >= hi - step * 1e-9:
            break
        out.append(round(v, 12))
        v += step
    return out


def fmt(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e6 or a < 1e-3:
        return f"{v:.2g}"
    if a >= 100:
        return f"{v:.0f}"
    return f"{v:.3g}"


def _scale(lo: float, hi: float, a: float, b: float):
    span = hi - lo or 1.0
    return lambda v: round(a + (v - lo) / span * (b - a), 1)  # SVG coordinates, 0.1 px


MAX_POINTS = 120
"""Points drawn per series; longer series are thinned to every k-th point (the last kept)."""


def thin(points: Sequence, max_points: int = MAX_POINTS) -> list:
    """Every ``k``-th of ``points`` (and the last) so that at most about ``max_points`` remain."""
    if len(points) <= max_points:
        return list(points)
    k = math.ceil(len(points) / max_points)
    idx = list(range(0, len(points), k))
    if idx[-1] != len(points) - 1:
        idx.append(len(points) - 1)
    return [points[i] for i in idx]


def line_chart(chart_id: str, title: str, x_label: str, y_label: str,
               series: Sequence[tuple[str, Sequence[tuple[float, float, str | None]]]],
               x_unit: str = "", y_range: tuple[float, float] | None = None) -> Chart:
    """A line chart of ``series``: ``(name, [(x, y, href), ...])``; non-finite points are
    left out. ``y_range`` fixes the y axis (e.g. ``(0, 1)`` for a rate)."""
    chart = Chart(chart_id, title, x_label, y_label)
    isfinite = math.isfinite
    finite = [(name, [p for p in s if isfinite(p[0]) and isfinite(p[1])]) for name, s in series]
    if not any(s for _, s in finite):
        return chart
    xs, ys = [p[0] for _, s in finite for p in s], [p[1] for _, s in finite for p in s]
    x_lo, x_hi = min(xs), max(xs)
    y_lo, y_hi = y_range if y_range else (min(ys), max(ys))
    if y_range is None:
        yt = nice_ticks(y_lo, y_hi)
        y_lo, y_hi = (min(yt[0], y_lo), max(yt[-1], y_hi)) if yt else (y_lo, y_hi)
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 1, x_hi + 1
    if y_hi == y_lo:
        y_lo, y_hi = y_lo - 1, y_hi + 1
    l, t, r, b = chart.plot
    sx, sy = _scale(x_lo, x_hi, l, r), _scale(y_lo, y_hi, b, t)
    chart.x_ticks = [Tick(sx(v), fmt(v)) for v in nice_ticks(x_lo, x_hi) if x_lo <= v <= x_hi]
    chart.y_ticks = [Tick(sy(v), fmt(v)) for v in nice_ticks(y_lo, y_hi) if y_lo <= v <= y_hi]
    for k, (name, s) in enumerate(finite):
        color = COLORS[k % len(COLORS)]
        points = [Point(x, y, sx(x), sy(y), f"{name}: {fmt(y)} at {x_label} {fmt(x)}{x_unit}", href)
                  for x, y, href in thin(s)]
        chart.lines.append(Line(name, color, points))
        chart.legend.append((name, color))
    return chart


def stacked_bars(chart_id: str, title: str, y_label: str, xs: Sequence[int],
                 stacks: Sequence[tuple[str, Sequence[float]]], hrefs: Sequence[str | None]) -> Chart:
    """Stacked bars, one per ``xs[i]`` (an iteration), one segment per ``stacks`` entry
    ``(name, values[len(xs)])`` (NaN counts as 0)."""
    chart = Chart(chart_id, title, "iteration", y_label)
    if not xs:
        return chart
    totals = [sum(v[i] for _, v in stacks if math.isfinite(v[i])) for i in range(len(xs))]
    top = max(totals) if totals and max(totals) > 0 else 1.0
    yt = nice_ticks(0.0, top)
    top = max(top, yt[-1]) if yt else top
    l, t, r, b = chart.plot
    sy = _scale(0.0, top, b, t)
    chart.y_ticks = [Tick(sy(v), fmt(v)) for v in yt if v <= top]
    shown = thin(list(range(len(xs))))  # bars of every k-th iteration when there are many
    slot = (r - l) / len(shown)
    w = min(48.0, max(1.0, slot * 0.8))
    every = max(1, len(shown) // 10)
    chart.x_ticks = [Tick(round(l + slot * (j + 0.5), 1), str(xs[i])) for j, i in enumerate(shown) if j % every == 0]
    for j, i in enumerate(shown):
        x = xs[i]
        acc, col = 0.0, []
        for k, (name, v) in enumerate(stacks):
            val = v[i] if math.isfinite(v[i]) else 0.0
            if val <= 0:
                continue
            y0, y1 = sy(acc), sy(acc + val)
            col.append(Bar(round(l + slot * j + (slot - w) / 2, 1), y1, round(w, 1), round(y0 - y1, 1), COLORS[k % len(COLORS)],
                           f"iteration {x}: {name} {fmt(val)} {y_label}", hrefs[i]))
            acc += val
        chart.bars.append(col)
    chart.legend = [(name, COLORS[k % len(COLORS)]) for k, (name, _) in enumerate(stacks)]
    return chart
