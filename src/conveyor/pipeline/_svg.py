"""A tiny inline-SVG chart helper for the HTML report: line charts over time and grouped bars.

No JavaScript and no network: every chart is a self-contained ``<svg>`` element."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from html import escape

PALETTE: tuple[str, ...] = (
    "#4e79a7",
    "#f28e2b",
    "#e15759",
    "#76b7b2",
    "#59a14f",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)

_W, _H = 720, 260
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 150, 28, 36


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values from at or below ``lo`` to at or above ``hi``.

    Steps are 1, 2 or 5 times a power of ten."""
    if not math.isfinite(lo) or not math.isfinite(hi):
        return [0.0]
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(1, count)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(lo / step) * step
    # The last tick is at or above ``hi``: it is the top of the axis, and no value may overflow it.
    ticks = [round(first, 10)]
    while ticks[-1] < hi - step * 1e-9:
        ticks.append(round(first + step * len(ticks), 10))
    return ticks


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.0f}"
    if abs(value) >= 1:
        return f"{value:.1f}".rstrip("0").rstrip(".")
    return f"{value:.3g}"


def _legend(names: Sequence[str]) -> list[str]:
    parts = []
    for i, name in enumerate(names):
        y = _TOP + 8 + i * 16
        color = PALETTE[i % len(PALETTE)]
        parts.append(f'<rect x="{_W - _RIGHT + 12}" y="{y - 8}" width="10" height="10" fill="{color}"/>')
        parts.append(f'<text x="{_W - _RIGHT + 28}" y="{y + 1}" font-size="11">{escape(name[:20])}</text>')
    return parts


def _frame(title: str, y_label: str, body: list[str]) -> str:
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_W} {_H}" width="{_W}" height="{_H}" '
        f'font-family="sans-serif" role="img" aria-label="{escape(title)}">'
        f'<text x="{_LEFT}" y="16" font-size="13" font-weight="bold">{escape(title)}</text>'
        f'<text x="12" y="{_TOP + (_H - _TOP - _BOTTOM) / 2}" font-size="11" '
        f'transform="rotate(-90 12 {_TOP + (_H - _TOP - _BOTTOM) / 2})" text-anchor="middle">'
        f"{escape(y_label)}</text>"
    )
    return head + "".join(body) + "</svg>"


def _y_axis(ticks: Sequence[float], y_of: Callable[[float], float]) -> list[str]:
    parts = []
    for t in ticks:
        y = y_of(t)
        parts.append(
            f'<line x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd" stroke-width="1"/>'
        )
        parts.append(f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" font-size="10" text-anchor="end">{_fmt(t)}</text>')
    return parts


def line_chart(
    title: str,
    series: Mapping[str, Sequence[tuple[datetime, float]]],
    y_label: str = "",
    step: bool = False,
) -> str:
    """A line chart of time series (one line per name); ``step`` draws a step function (depth)."""
    points = [p for values in series.values() for p in values]
    if not points:
        return _frame(title, y_label, [f'<text x="{_LEFT}" y="{_H / 2}" font-size="12">no data</text>'])
    xs = [p[0].timestamp() for p in points]
    x_lo, x_hi = min(xs), max(xs)
    if x_hi <= x_lo:
        x_hi = x_lo + 60.0
    y_hi = max(0.0, *(p[1] for p in points))
    ticks = nice_ticks(0.0, y_hi if y_hi > 0 else 1.0)
    top = ticks[-1]
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def x_of(ts: float) -> float:
        return _LEFT + (ts - x_lo) / (x_hi - x_lo) * plot_w

    def y_of(v: float) -> float:
        return _TOP + plot_h - (v / top) * plot_h

    body = _y_axis(ticks, y_of)
    for i in range(5):
        ts = x_lo + (x_hi - x_lo) * i / 4
        label = datetime.fromtimestamp(ts, UTC).strftime("%m-%d %H:%M")
        body.append(
            f'<text x="{x_of(ts):.1f}" y="{_H - _BOTTOM + 16}" font-size="10" text-anchor="middle">{label}</text>'
        )
    for i, (name, values) in enumerate(series.items()):
        ordered = sorted(values, key=lambda p: p[0])
        coords: list[str] = []
        prev_y: float | None = None
        for when, v in ordered:
            x, y = x_of(when.timestamp()), y_of(v)
            if step and prev_y is not None:
                coords.append(f"{x:.1f},{prev_y:.1f}")
            coords.append(f"{x:.1f},{y:.1f}")
            prev_y = y
        color = PALETTE[i % len(PALETTE)]
        body.append(
            f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{" ".join(coords)}">'
            f"<title>{escape(name)}</title></polyline>"
        )
    body += _legend(list(series))
    return _frame(title, y_label, body)


def bar_chart(
    title: str,
    categories: Sequence[str],
    series: Mapping[str, Sequence[float | None]],
    y_label: str = "",
) -> str:
    """A grouped bar chart: one group per category, one bar per series (None draws no bar)."""
    values = [v for vs in series.values() for v in vs if v is not None]
    if not categories or not values:
        return _frame(title, y_label, [f'<text x="{_LEFT}" y="{_H / 2}" font-size="12">no data</text>'])
    ticks = nice_ticks(0.0, max(values) if max(values) > 0 else 1.0)
    top = ticks[-1]
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def y_of(v: float) -> float:
        return _TOP + plot_h - (v / top) * plot_h

    body = _y_axis(ticks, y_of)
    group_w = plot_w / len(categories)
    bar_w = group_w * 0.8 / max(1, len(series))
    for c, category in enumerate(categories):
        x0 = _LEFT + c * group_w + group_w * 0.1
        for s, (name, vs) in enumerate(series.items()):
            v = vs[c]
            if v is None:
                continue
            y = y_of(v)
            body.append(
                f'<rect x="{x0 + s * bar_w:.1f}" y="{y:.1f}" width="{bar_w:.1f}" '
                f'height="{_TOP + plot_h - y:.1f}" fill="{PALETTE[s % len(PALETTE)]}">'
                f"<title>{escape(category)} {escape(name)}: {_fmt(v)}</title></rect>"
            )
        body.append(
            f'<text x="{x0 + group_w * 0.4:.1f}" y="{_H - _BOTTOM + 14}" font-size="10" '
            f'text-anchor="middle">{escape(category[:14])}</text>'
        )
    body += _legend(list(series))
    return _frame(title, y_label, body)
