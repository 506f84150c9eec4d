"""Read models of the validation pages: the (model x engine) matrix and one run's drill-down.

A pass or warn is shown only when finite numbers back it: a row stored before ingest checked
(SQLite keeps a NaN as NULL) shows as an error with the reason, never under a pass verdict.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from sqlmodel import Session, col, select

from ie_dashboard.tables import ArchitectureRow, ValidatorPointRow, ValidatorRunRow
from ie_dashboard.views import NotFound, list_points

__all__ = ["Matrix", "MatrixCell", "RunDetail", "run_detail", "validation_matrix"]

ENGINE_ORDER = (
    "eager",
    "vllm",
    "vllm-static",
    "transformer-lens",
    "transformer_lens",
    "nnsight",
    "nnterp",
)


@dataclass(frozen=True)
class MatrixCell:
    run: ValidatorRunRow
    counts: dict[str, int]
    verdict: str  # the run's verdict, or `error` when a pass/warn point has no finite numbers


UNBACKED = (
    "stored as {status} without a finite cos, max abs and rel diff (ingested before the "
    "dashboard checked); re-run the validator and ingest again"
)


def _unbacked(status: str, *numbers: float | None) -> bool:
    """A pass or warn with a missing or non-finite number: nothing backs the verdict."""
    return status in ("pass", "warn") and any(v is None or not math.isfinite(v) for v in numbers)


def _shown_verdict(verdict: str, any_unbacked: bool) -> str:
    return "error" if any_unbacked and verdict in ("pass", "warn") else verdict


@dataclass
class Matrix:
    models: list[str] = field(default_factory=list)
    engines: list[str] = field(default_factory=list)
    cells: dict[tuple[str, str], MatrixCell] = field(default_factory=dict)


def _engine_key(engine: str) -> tuple[int, str]:
    return (ENGINE_ORDER.index(engine) if engine in ENGINE_ORDER else len(ENGINE_ORDER), engine)


def validation_matrix(session: Session) -> Matrix:
    latest: dict[tuple[str, str], ValidatorRunRow] = {}
    for run in session.exec(select(ValidatorRunRow).order_by(col(ValidatorRunRow.captured_at))):
        latest[(run.hf_id, run.engine)] = run
    matrix = Matrix()
    matrix.models = sorted({m for m, _ in latest})
    matrix.engines = sorted({e for _, e in latest}, key=_engine_key)
    for key, run in latest.items():
        counts: dict[str, int] = {}
        unbacked = False
        for p in session.exec(select(ValidatorPointRow).where(ValidatorPointRow.run_id == run.id)):
            status = p.status
            if _unbacked(status, p.cos, p.max_abs_diff, p.rel_diff):
                status, unbacked = "error", True
            counts[status] = counts.get(status, 0) + 1
        matrix.cells[key] = MatrixCell(run, counts, _shown_verdict(run.verdict, unbacked))
    return matrix


@dataclass(frozen=True)
class RunDetail:
    run: ValidatorRunRow
    layers: list[int | None]
    grid: dict[str, dict[int | None, ValidatorPointRow]]  # point -> layer -> result
    results: list[ValidatorPointRow]
    versions: dict[str, Any]
    architecture: str | None  # the cheat-sheet slug of the run's family, when registered
    linkable: frozenset[str]  # points that have a card to link to
    verdict: str  # as MatrixCell.verdict


def _checked(row: ValidatorPointRow) -> ValidatorPointRow:
    """`row`, or a detached copy shown as an error when its pass/warn has no finite numbers."""
    if not _unbacked(row.status, row.cos, row.max_abs_diff, row.rel_diff):
        return row
    reason = UNBACKED.format(status=row.status)
    return ValidatorPointRow(**{**row.model_dump(), "status": "error", "reason": reason})


def run_detail(session: Session, model: str, engine: str) -> RunDetail:
    run = session.exec(
        select(ValidatorRunRow)
        .where(ValidatorRunRow.hf_id == model, ValidatorRunRow.engine == engine)
        .order_by(col(ValidatorRunRow.captured_at).desc())
    ).first()
    if run is None:
        raise NotFound(f"no validator result for model {model!r} on engine {engine!r}")
    order = {p.name: p.position for p in list_points(session)}
    stored = list(session.exec(select(ValidatorPointRow).where(ValidatorPointRow.run_id == run.id)))
    unbacked = any(_unbacked(r.status, r.cos, r.max_abs_diff, r.rel_diff) for r in stored)
    results = sorted(
        (_checked(r) for r in stored),
        key=lambda r: (order.get(r.point, len(order)), r.point, -1 if r.layer is None else r.layer),
    )
    layers = sorted({r.layer for r in results}, key=lambda x: -1 if x is None else x)
    grid: dict[str, dict[int | None, ValidatorPointRow]] = {}
    for r in results:
        grid.setdefault(r.point, {})[r.layer] = r
    arch = run.family if run.family and session.get(ArchitectureRow, run.family) else None
    versions = json.loads(run.versions_json)
    return RunDetail(
        run,
        layers,
        grid,
        results,
        versions,
        arch,
        frozenset(order) if arch else frozenset(),
        _shown_verdict(run.verdict, unbacked),
    )
