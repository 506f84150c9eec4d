"""Horizontal grouped bars as plain SVG geometry (no JS): one group per variant (generation: two
series) or per peer (a workload section: one bar per series the record holds)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ie_dashboard.records import Section
from ie_dashboard.views import ModelThroughput

LABEL_W = 150
CHAR_W = 7.2  # of the 12 px monospace group labels, to fit a workload's longest peer name
MAX_LABEL_W = 300
PLOT_W = 520
BAR_H = 14
GROUP_GAP = 14
SERIES = (("one_stream", "1 stream"), ("concurrent", "concurrent"))


@dataclass(frozen=True)
class Bar:
    series: str
    x: float
    y: float
    w: float
    h: float
    text: str


@dataclass(frozen=True)
class Group:
    label: str
    y: float
    bars: tuple[Bar, ...]


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    label_w: int
    groups: tuple[Group, ...]
    ticks: tuple[tuple[float, str], ...]


def fmt_rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}" if value >= 10 else f"{value:,.2f}"


def _scale(value: float) -> tuple[float, float]:
    """(axis maximum, tick step): the smallest 1 / 2 / 2.5 / 5 x 10^k at or above `value`."""
    if value <= 0:
        return 1.0, 0.2
    mag = 10.0 ** math.floor(math.log10(value))
    for lead, step in ((1, 0.2), (2, 0.5), (2.5, 0.5), (5, 1), (10, 2)):
        if value <= lead * mag * (1 + 1e-9):
            return lead * mag, step * mag
    return 10 * mag, 2 * mag


def _tick(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 or value == int(value) else f"{value:g}"


def chart(model: ModelThroughput) -> Chart:
    top, step = _scale(model.peak)
    groups = []
    y = 24.0
    for f in model.figures:
        bars = []
        for i, (attr, series) in enumerate(SERIES):
            value = getattr(f, attr)
            status = f.one_status if attr == "one_stream" else f.concurrent_status
            w = 0.0 if value is None else PLOT_W * value / top
            text = fmt_rate(value) if value is not None else status
            bars.append(Bar(series, LABEL_W, y + i * (BAR_H + 2), w, BAR_H, text))
        groups.append(Group(f.variant, y, tuple(bars)))
        y += 2 * (BAR_H + 2) + GROUP_GAP
    n = round(top / step)
    ticks = tuple((LABEL_W + PLOT_W * k / n, _tick(step * k)) for k in range(n + 1))
    return Chart(LABEL_W + PLOT_W + 90, int(y + 10), LABEL_W, tuple(groups), ticks)


def section_chart(section: Section) -> Chart:
    """One group per peer, one bar per series (`Bar.series` is the series' index as text, for
    its colour); a figure the peer did not produce is a labelled empty bar."""
    values = [b.value for b in section.bars if b.value is not None]
    top, step = _scale(max(values, default=0.0))
    label_w = int(min(MAX_LABEL_W, max(LABEL_W, 16 + CHAR_W * max(map(len, section.peers)))))
    groups = []
    y = 24.0
    for peer in section.peers:
        bars = []
        for i, series in enumerate(section.series):
            b = section.value(peer, series)
            value = None if b is None else b.value
            w = 0.0 if value is None else PLOT_W * value / top
            text = fmt_rate(value) if value is not None else (b.status if b else "") or "-"
            bars.append(Bar(str(i), label_w, y + i * (BAR_H + 2), w, BAR_H, text))
        groups.append(Group(peer, y, tuple(bars)))
        y += len(section.series) * (BAR_H + 2) + GROUP_GAP
    n = round(top / step)
    ticks = tuple((label_w + PLOT_W * k / n, _tick(step * k)) for k in range(n + 1))
    return Chart(label_w + PLOT_W + 90, int(y + 10), label_w, tuple(groups), ticks)
