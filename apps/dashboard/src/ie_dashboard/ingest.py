"""Idempotent writes: a benchmark cell or a validator result becomes rows in one transaction.

The natural key (model, variant, start time / model, engine, capture time) decides identity: the
same cell ingested twice updates one row and replaces its children instead of adding rows.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from sqlmodel import Session, delete, select

from ie_dashboard.schemas import BenchmarkCell, ValidatorResult
from ie_dashboard.tables import (
    BenchmarkCellRow,
    ValidatorPointRow,
    ValidatorRunRow,
    WorkloadRow,
)


def iso(value: datetime) -> str:
    """UTC ISO-8601; a naive time is taken as UTC so one instant has one key."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat()


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def environment_summary(cell: BenchmarkCell) -> tuple[str, str]:
    """(device, one-line label) for the page: the hardware, dtype and size profile of a figure."""
    env = cell.environment
    extra = cell.model_extra or {}
    gpu = env.get("gpu")
    gpu_name = gpu.get("name") if isinstance(gpu, dict) else gpu
    profile = extra.get("profile")
    profile_name = profile.get("name") if isinstance(profile, dict) else profile
    device = str(
        env.get("device") or (profile.get("device") if isinstance(profile, dict) else "") or ""
    )
    if not device:
        device = "cuda" if gpu_name else "cpu"
    hardware = str(gpu_name or env.get("cpu") or device)
    dtype = env.get("dtype_resolved") or env.get("dtype") or extra.get("dtype")
    if not dtype and isinstance(profile, dict):
        dtype = profile.get("dtype")
    parts = [
        hardware,
        str(dtype) if dtype else "",
        f"profile {profile_name}" if profile_name else "",
    ]
    return device, ", ".join(p for p in parts if p)


def upsert_cell(session: Session, cell: BenchmarkCell, source: str) -> tuple[int, bool]:
    """Store `cell`; returns (row id, created)."""
    key = f"{cell.model.model_id}|{cell.variant}|{iso(cell.started)}"
    row = session.exec(select(BenchmarkCellRow).where(BenchmarkCellRow.cell_key == key)).first()
    created = row is None
    if row is None:
        row = BenchmarkCellRow(
            cell_key=key, model=cell.model.model_id, variant=cell.variant, started=iso(cell.started)
        )
    device, label = environment_summary(cell)
    command = cell.command if isinstance(cell.command, str) else " ".join(cell.command)
    row.finished = iso(cell.finished) if cell.finished else None
    row.command = command
    row.device = device
    row.env_label = label
    row.env_json = _dumps(cell.environment)
    row.raw_json = cell.model_dump_json()
    row.source = source
    row.ingested_at = _now()
    session.add(row)
    session.flush()
    assert row.id is not None
    session.exec(delete(WorkloadRow).where(WorkloadRow.cell_id == row.id))  # type: ignore[arg-type]
    for w in cell.workloads:
        detail = w.detail if isinstance(w.detail, str) or w.detail is None else _dumps(w.detail)
        session.add(
            WorkloadRow(
                cell_id=row.id,
                workload=w.workload,
                status=w.status,
                metrics_json=_dumps(w.metrics),
                detail=detail or "",
            )
        )
    return row.id, created


def upsert_validator(session: Session, result: ValidatorResult, source: str) -> tuple[int, bool]:
    """Store `result`; returns (row id, created)."""
    key = f"{result.hf_id}|{result.engine}|{iso(result.captured_at)}"
    row = session.exec(select(ValidatorRunRow).where(ValidatorRunRow.run_key == key)).first()
    created = row is None
    if row is None:
        row = ValidatorRunRow(
            run_key=key,
            hf_id=result.hf_id,
            engine=result.engine,
            verdict=result.verdict,
            captured_at=iso(result.captured_at),
        )
    row.reference = result.reference
    row.verdict = result.verdict
    row.status = result.status
    row.dtype = result.dtype
    row.device = result.device
    row.versions_json = _dumps(result.versions)
    row.raw_json = result.model_dump_json()
    row.source = source
    row.ingested_at = _now()
    session.add(row)
    session.flush()
    assert row.id is not None
    session.exec(delete(ValidatorPointRow).where(ValidatorPointRow.run_id == row.id))  # type: ignore[arg-type]
    for p in result.points:
        session.add(
            ValidatorPointRow(
                run_id=row.id,
                address=p.address,
                point=p.point,
                layer=p.layer,
                tier=p.tier,
                cos=p.cos,
                max_abs_diff=p.max_abs_diff,
                rel_diff=p.rel_diff,
                status=p.status,
                reason=p.reason,
            )
        )
    return row.id, created
