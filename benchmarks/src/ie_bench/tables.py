"""Number formatting and markdown tables shared by the report and the published README block."""

from __future__ import annotations

from collections.abc import Sequence


def rounded(value: float) -> str:
    """Published rounding: whole numbers from 10 up (with thousands separators), else 2 digits."""
    if value >= 10:
        return f"{value:,.0f}"
    if value >= 1:
        return f"{value:.1f}"
    return f"{value:.2g}"


def precise(value: float) -> str:
    """Report precision: four significant digits, thousands separated."""
    if abs(value) >= 1000:
        return f"{value:,.1f}"
    return f"{value:.4g}"


def multiplier(value: float, baseline: float) -> float:
    """Always from the unrounded figures, so a printed ratio never compounds two roundings."""
    return value / baseline


def rounded_multiplier(ratio: float) -> str:
    return f"{ratio:.1f}x" if ratio < 20 else f"{ratio:,.0f}x"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A column-aligned markdown table (aligned so the raw README reads as well as the rendered one)."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=False)]
    widths = [max(w, 3) for w in widths]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    sep = "| " + " | ".join("-" * w for w in widths) + " |"
    return "\n".join([line(header), sep, *(line(r) for r in rows)])
