"""Which quantized checkpoints each backend was verified on, per family and point.

Read from the validator's runs of a family's quantized checkpoints (`ie-synthetic/llama-w8a8`:
their records carry `quantization`), so a card claims a scheme only where a validator run
compared the point: one source of truth, nothing hand-written. The reference (eager) counts as
verified on a scheme where it produced the point for that run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sqlmodel import Session, col, select

from ie_dashboard.tables import ValidatorPointRow, ValidatorRunRow

__all__ = ["QuantVerified", "verified_quantizations"]

_RANK = {"fail": 3, "warn": 2, "pass": 1, "n/a": 0}
REFERENCE_REFUSES = "reference cannot produce it"


@dataclass(frozen=True)
class QuantVerified:
    """One backend on one scheme for one point: the worst status over the compared layers."""

    backend: str
    scheme: str
    status: str  # pass / warn / fail (compared), n/a (not served; reason says why)
    rel: float | None  # the largest relative error over layers; None when nothing compared
    model: str  # the checkpoint the validator ran
    reason: str = ""


def _latest_quantized_runs(session: Session, family: str) -> list[tuple[ValidatorRunRow, str]]:
    """The newest run per (checkpoint, engine) of `family`'s quantized checkpoints, with scheme."""
    rows = session.exec(
        select(ValidatorRunRow)
        .where(ValidatorRunRow.family == family)
        .order_by(col(ValidatorRunRow.captured_at).desc())
    ).all()
    seen: set[tuple[str, str]] = set()
    out = []
    for row in rows:
        scheme = str(json.loads(row.raw_json or "{}").get("quantization") or "")
        if not scheme or row.status != "ok" or (row.hf_id, row.engine) in seen:
            continue
        seen.add((row.hf_id, row.engine))
        out.append((row, scheme))
    return out


def _summary(
    backend: str, scheme: str, model: str, points: list[ValidatorPointRow]
) -> QuantVerified:
    compared = [p for p in points if p.status != "n/a"]
    if not compared:
        reason = points[0].reason if points else "not compared"
        return QuantVerified(backend, scheme, "n/a", None, model, reason)
    worst = max(compared, key=lambda p: _RANK.get(p.status, 3))
    rels = [p.rel_diff for p in compared if p.rel_diff is not None]
    return QuantVerified(
        backend, scheme, worst.status, max(rels, default=None), model, worst.reason
    )


def verified_quantizations(session: Session, family: str, point: str) -> list[QuantVerified]:
    """Per backend (the reference first) and scheme, what the validator found for `point`."""
    out: dict[tuple[str, str], QuantVerified] = {}
    for run, scheme in _latest_quantized_runs(session, family):
        points = list(
            session.exec(
                select(ValidatorPointRow).where(
                    ValidatorPointRow.run_id == run.id, ValidatorPointRow.point == point
                )
            ).all()
        )
        if not points:
            continue
        out[(run.engine, scheme)] = _summary(run.engine, scheme, run.hf_id, points)
        produced = any(REFERENCE_REFUSES not in p.reason for p in points)
        ref_key = (run.reference, scheme)
        if produced and ref_key not in out:
            out[ref_key] = QuantVerified(run.reference, scheme, "reference", None, run.hf_id)
    order = {"eager": 0, "vllm": 1, "vllm-static": 2}
    return sorted(out.values(), key=lambda q: (order.get(q.backend, 9), q.backend, q.scheme))
