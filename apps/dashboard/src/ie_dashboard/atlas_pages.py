"""Read models of the atlas pages: the atlases, a dictionary's index (a page of features through an
index, never the whole table) and one feature's page; the link from a graph node to its feature.

The index reads only `atlas_features`' small columns, `PAGE_SIZE` rows at a time, ordered along
one of the table's indexes (feature id, density, max activation, top token), so its cost does not
grow with the dictionary's width; a feature page reads one row by (atlas, feature).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy import ColumnElement
from sqlmodel import Session, col, select

from ie_dashboard.tables import AtlasFeatureRow, AtlasRow
from ie_dashboard.views import NotFound

PAGE_SIZE = 50
MAX_ID = 2**31 - 1  # row ids and feature ids are 32-bit on PostgreSQL
SORTS = ("feature", "density", "max")
HIST_WIDTH, HIST_HEIGHT = 640, 140


@dataclass(frozen=True)
class IndexRow:
    feature: int
    fired: int
    density: float
    max_act: float
    top_token: str


@dataclass(frozen=True)
class IndexPage:
    atlas: AtlasRow
    rows: tuple[IndexRow, ...]
    page: int
    pages: int | None  # None for a token search (its size is not counted)
    has_next: bool
    sort: str
    query: str
    note: str  # what a search found, in words ("" when not searching)


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    label: str  # the bin's range and count


@dataclass(frozen=True)
class Histogram:
    bars: tuple[Bar, ...]
    ticks: tuple[tuple[float, str], ...]  # (x, label) at octave edges


@dataclass(frozen=True)
class FeatureView:
    atlas: AtlasRow
    row: AtlasFeatureRow
    page: dict[str, Any]
    histogram: Histogram


def _number(text: str, what: str, hint: str) -> int:
    if not text.isascii() or not text.isdigit() or len(text) > 10 or int(text) > MAX_ID:
        raise NotFound(f"{what} {text!r} is not a whole number; {hint}")
    return int(text)


def _is_id(query: str) -> bool:
    """A search for a feature id: ASCII digits only (`"²".isdigit()` is true, `int("²")` fails)."""
    return query.isascii() and query.isdigit()


def list_atlases(session: Session) -> list[AtlasRow]:
    return list(session.exec(select(AtlasRow).order_by(col(AtlasRow.id).desc())).all())


def atlas_row(session: Session, atlas_id: str) -> AtlasRow:
    number = _number(atlas_id, "atlas", "/atlases lists the stored ones")
    row = session.get(AtlasRow, number) if number > 0 else None
    if row is None:
        raise NotFound(f"no atlas {atlas_id}; /atlases lists the stored ones")
    return row


def _columns() -> Any:
    """The index's columns (never `page_json`)."""
    f = AtlasFeatureRow
    return sa.select(col(f.feature), col(f.fired), col(f.density), col(f.max_act), col(f.top_token))


def _ordered(atlas_id: int, sort: str) -> Any:
    q = _columns().where(AtlasFeatureRow.atlas_id == atlas_id)
    if sort == "density":
        return q.order_by(col(AtlasFeatureRow.density).desc(), col(AtlasFeatureRow.feature).desc())
    if sort == "max":
        return q.order_by(col(AtlasFeatureRow.max_act).desc(), col(AtlasFeatureRow.feature).desc())
    return q.order_by(col(AtlasFeatureRow.feature))


def _token_range(text: str) -> ColumnElement[bool]:
    """Keys starting with `text`, as a range the token index answers (LIKE would scan)."""
    key = col(AtlasFeatureRow.token_key)
    return (key >= text) & (key < text + "\U0010ffff")


def index_query(atlas: AtlasRow, page: int, sort: str, query: str) -> Any:
    """The SELECT of one index page (tests read its plan: an index, no sort, no full scan)."""
    assert atlas.id is not None
    if _is_id(query):
        return _columns().where(
            AtlasFeatureRow.atlas_id == atlas.id, AtlasFeatureRow.feature == int(query)
        )
    if query:
        return (
            _columns()
            .where(AtlasFeatureRow.atlas_id == atlas.id, _token_range(query.strip().casefold()))
            .order_by(col(AtlasFeatureRow.token_key), col(AtlasFeatureRow.feature))
            .offset((page - 1) * PAGE_SIZE)
            .limit(PAGE_SIZE + 1)
        )
    return _ordered(atlas.id, sort).offset((page - 1) * PAGE_SIZE).limit(PAGE_SIZE + 1)


def index_page(
    session: Session, atlas_id: str, page: str = "1", sort: str = "feature", query: str = ""
) -> IndexPage:
    atlas = atlas_row(session, atlas_id)
    number = _number(page, "page", "pages are numbered from 1")
    if sort not in SORTS:
        raise NotFound(f"unknown sort {sort!r}; sort by one of {', '.join(SORTS)}")
    query = query.strip()[:200]
    pages = None if query else max(1, math.ceil(atlas.d_sae / PAGE_SIZE))
    if number < 1 or (pages is not None and number > pages):
        raise NotFound(f"no page {page} of atlas {atlas.id}; it has pages 1 to {pages}")
    # An id past the width is no row; it is not sent to the database (a 32-bit column there).
    beyond = _is_id(query) and (len(query) > 10 or int(query) >= atlas.d_sae)
    found = (
        []
        if beyond
        else [IndexRow(*r) for r in session.execute(index_query(atlas, number, sort, query)).all()]
    )
    note = ""
    if _is_id(query):
        note = f"feature {query}" if found else f"no feature {query} (this atlas has 0 to {atlas.d_sae - 1})"  # fmt: skip
    elif query:
        note = f"features whose top token starts with {query!r}" if found else f"no feature's top token starts with {query!r}"  # fmt: skip
    return IndexPage(
        atlas, tuple(found[:PAGE_SIZE]), number, pages, len(found) > PAGE_SIZE, sort, query, note
    )


def histogram(counts: list[int], edges: list[float]) -> Histogram:
    """Bars from the first to the last non-empty bin (bins are log-spaced: equal widths here)."""
    used = [i for i, c in enumerate(counts) if c]
    if not used:
        return Histogram((), ())
    lo, hi = max(0, used[0] - 1), min(len(counts) - 1, used[-1] + 1)
    step = HIST_WIDTH / (hi - lo + 1)
    top = max(counts)
    bars = []
    for i in range(lo, hi + 1):
        h = (HIST_HEIGHT - 20) * counts[i] / top
        left = "0" if i == 0 else f"{edges[i - 1]:.3g}"
        right = "inf" if i == len(counts) - 1 else f"{edges[i]:.3g}"
        bars.append(Bar((i - lo) * step, HIST_HEIGHT - 20 - h, step * 0.9, h,
                        f"[{left}, {right}): {counts[i]:,}"))  # fmt: skip
    per_octave = _per_octave(edges)
    ticks = [
        ((i + 1 - lo) * step, f"{edges[i]:.3g}")
        for i in range(max(0, lo - 1), min(len(edges), hi))
        if i % (per_octave * 2) == 0
    ]
    return Histogram(tuple(bars), tuple(ticks))


def _per_octave(edges: list[float]) -> int:
    """Bins per doubling: the first edge index at twice the first edge."""
    for i, e in enumerate(edges):
        if e >= 2 * edges[0] * (1 - 1e-6):
            return max(1, i)
    return 1


def feature_view(session: Session, atlas_id: str, feature: str) -> FeatureView:
    atlas = atlas_row(session, atlas_id)
    hint = f"atlas {atlas.id} has features 0 to {atlas.d_sae - 1}"
    number = _number(feature, "feature", hint)
    row = None
    if number < atlas.d_sae:
        row = session.exec(
            select(AtlasFeatureRow).where(
                AtlasFeatureRow.atlas_id == atlas.id, AtlasFeatureRow.feature == number
            )
        ).first()
    if row is None:
        raise NotFound(f"no feature {feature}: {hint}")
    page = json.loads(row.page_json)
    edges = json.loads(atlas.spec_json).get("bin_edges") or []
    return FeatureView(atlas, row, page, histogram(page["histogram"], edges))


def shade(act: float, peak: float) -> str:
    """A token's background: orange, as opaque as its activation's share of the feature's max."""
    alpha = 0.0 if peak <= 0 or not math.isfinite(act) else min(1.0, max(0.0, act / peak))
    return f"rgba(255,140,0,{alpha:.2f})"


def dictionary_index(node_id: str, layer: str) -> int | None:
    """A graph feature's index in its layer's dictionary, from its id `{layer}_{index}_{pos}`
    (the JSON's `feature` is a Cantor pairing of layer and index, not the index)."""
    parts = node_id.split("_")
    if len(parts) != 3 or parts[0] != layer or not all(p.isascii() and p.isdigit() for p in parts):
        return None
    return int(parts[1])


def atlases_for_scan(session: Session, scan: str) -> dict[int, int]:
    """Layer -> the newest atlas of that layer of this transcoder set (a graph's `scan`)."""
    if not scan:
        return {}
    rows = session.exec(
        select(AtlasRow.id, AtlasRow.layer).where(AtlasRow.scan == scan).order_by(col(AtlasRow.id))
    ).all()
    return {int(layer): int(i) for i, layer in rows if layer is not None and i is not None}
