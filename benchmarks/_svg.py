"""Horizontal bar charts as SVG text: the drawing half of :mod:`benchmarks.charts`.

Hand-rolled (no plotting library to install): a figure is a column of
panels, each a titled set of rows; a row is one bar, or one bar of stacked
segments, with its value written after it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from xml.sax.saxutils import escape

WIDTH = 960
_LABEL_W = 300
_VALUE_W = 130
_ROW_H = 22
_BAR_H = 15
_TITLE_H = 28
_AXIS_H = 18
_GAP = 18
_FONT = "font-family='DejaVu Sans, Helvetica, Arial, sans-serif'"


@dataclass(frozen=True, slots=True)
class Segment:
    """One part of a bar: its value, its colour and the legend name."""

    value: float
    color: str
    name: str = ""


@dataclass(frozen=True, slots=True)
class Row:
    """One bar (one segment, or several stacked) and the text after it."""

    label: str
    segments: tuple[Segment, ...]
    text: str

    @property
    def total(self) -> float:
        return sum(s.value for s in self.segments)


@dataclass(frozen=True, slots=True)
class Panel:
    """A titled group of rows on one scale."""

    title: str
    rows: tuple[Row, ...]
    unit: str = ""


@dataclass
class Figure:
    """Panels one below the other, a title above and notes below."""

    title: str
    panels: list[Panel] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    legend: list[Segment] = field(default_factory=list)

    def render(self) -> str:
        parts: list[str] = []
        y = 34.0
        parts.append(_text(12, 22, self.title, size=16, weight="bold"))
        if self.legend:
            y = _legend(parts, self.legend, y + 4)
        for panel in self.panels:
            y = _panel(parts, panel, y + _GAP)
        for note in self.notes:
            y += 18
            parts.append(_text(12, y, note, size=11, fill="#555"))
        height = y + 14
        head = (
            f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' "
            f"height='{height}' viewBox='0 0 {WIDTH} {height}' {_FONT}>"
            f"<rect width='{WIDTH}' height='{height}' fill='white'/>"
        )
        return head + "".join(parts) + "</svg>\n"


def _text(
    x: float,
    y: float,
    text: str,
    *,
    size: int = 12,
    anchor: str = "start",
    weight: str = "normal",
    fill: str = "#222",
) -> str:
    return (
        f"<text x='{x:.1f}' y='{y:.1f}' font-size='{size}' text-anchor='{anchor}' "
        f"font-weight='{weight}' fill='{fill}'>{escape(text)}</text>"
    )


def _legend(parts: list[str], items: Sequence[Segment], y: float) -> float:
    x = 12.0
    y += 14
    for item in items:
        width = 22 + 7 * len(item.name)
        if x + width > WIDTH - 12:
            x, y = 12.0, y + 18
        parts.append(
            f"<rect x='{x:.1f}' y='{y - 10:.1f}' width='12' height='12' "
            f"fill='{item.color}'/>"
        )
        parts.append(_text(x + 16, y, item.name, size=11))
        x += width + 16
    return y


def nice_step(top: float, ticks: int = 4) -> float:
    """A round tick step (1, 2 or 5 times a power of ten) for 0..*top*."""
    if top <= 0 or not math.isfinite(top):
        return 1.0
    raw = top / ticks
    power = 10.0 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if factor * power >= raw:
            return factor * power
    return 10 * power


def _tick_text(value: float) -> str:
    if value >= 1000:
        return f"{value / 1000:g}k"
    return f"{value:g}"


def _panel(parts: list[str], panel: Panel, y: float) -> float:
    parts.append(_text(12, y + 16, panel.title, size=13, weight="bold"))
    top_y = y + _TITLE_H
    plot_x, plot_w = _LABEL_W, WIDTH - _LABEL_W - _VALUE_W
    largest = max((row.total for row in panel.rows), default=0.0)
    step = nice_step(largest)
    scale_top = step * max(1, math.ceil(largest / step)) if largest > 0 else 1.0
    bottom = top_y + _ROW_H * max(len(panel.rows), 1)
    tick = 0.0
    while tick <= scale_top + step / 2:
        x = plot_x + plot_w * tick / scale_top
        parts.append(
            f"<line x1='{x:.1f}' y1='{top_y - 4:.1f}' x2='{x:.1f}' "
            f"y2='{bottom:.1f}' stroke='#ddd'/>"
        )
        parts.append(
            _text(
                x, bottom + 13, _tick_text(tick), size=10, anchor="middle", fill="#666"
            )
        )
        tick += step
    if panel.unit:
        parts.append(
            _text(plot_x + plot_w, bottom + 13 + 13, panel.unit, size=10, anchor="end")
        )
    for i, row in enumerate(panel.rows):
        row_y = top_y + i * _ROW_H
        parts.append(
            _text(plot_x - 8, row_y + _BAR_H - 3, row.label, size=11, anchor="end")
        )
        x = float(plot_x)
        for segment in row.segments:
            w = plot_w * max(segment.value, 0.0) / scale_top
            title = f"<title>{escape(segment.name)}: {segment.value:,.3g}</title>"
            parts.append(
                f"<rect x='{x:.1f}' y='{row_y:.1f}' width='{w:.1f}' "
                f"height='{_BAR_H}' fill='{segment.color}'>{title}</rect>"
            )
            x += w
        parts.append(_text(x + 5, row_y + _BAR_H - 3, row.text, size=11))
    return bottom + _AXIS_H + (13 if panel.unit else 0)
