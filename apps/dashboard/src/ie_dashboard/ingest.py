"""Idempotent writes: a benchmark cell or a validator result becomes rows in one transaction.

The natural key (`keys.py`: model, variant, profile, start time / model, engine, capture time)
decides identity: the same cell ingested twice updates one row and replaces its children instead
of adding rows. On a server, writers of one key take turns (an advisory lock per key, taken
before the key is looked up), so concurrent ingests of one cell neither fail nor duplicate it.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any, TypeVar

from ie_core.tooling.records import BenchmarkCell, ValidatorResult
from sqlmodel import Session, SQLModel, delete, select

from ie_dashboard.graphs import check_graph
from ie_dashboard.keys import cell_key, graph_key, record_key, run_key
from ie_dashboard.postgres import claim
from ie_dashboard.records import Section
from ie_dashboard.tables import (
    BenchmarkCellRow,
    GraphRow,
    ValidatorPointRow,
    ValidatorRunRow,
    WorkloadRecordRow,
    WorkloadRow,
)

R = TypeVar("R", bound=SQLModel)


def iso(value: datetime) -> str:
    """UTC ISO-8601; a naive time is taken as UTC so one instant has one key."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat()


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _stored(session: Session, table: type[R], column: Any, key: str, lock: str) -> R | None:
    """The row stored under `key`, looked up only once this writer holds `lock` (so a concurrent
    ingest of the same key waits here rather than inserting it twice)."""
    claim(session, lock)
    return session.exec(select(table).where(column == key)).first()


def environment_summary(cell: BenchmarkCell) -> tuple[str, str]:
    """(device, one-line label): the hardware, dtype and size profile a figure was measured under."""
    env, load = cell.environment, cell.load
    gpu = env.get("gpu")
    device = str(load.get("device") or cell.profile.device or ("cuda" if gpu else "cpu"))
    if isinstance(gpu, dict) and gpu.get("name"):
        count = gpu.get("count") or 1
        hardware = f"{count}x {gpu['name']}" if count > 1 else str(gpu["name"])
    else:
        cores = env.get("cpu_count")
        hardware = f"{env.get('cpu') or 'CPU'}" + (f" ({cores} threads)" if cores else "")
    dtype = load.get("dtype_resolved") or load.get("dtype_requested") or cell.profile.dtype
    parts = [hardware, str(dtype) if dtype else "", f"profile {cell.profile.name}"]
    return device, ", ".join(p for p in parts if p)


def upsert_cell(session: Session, cell: BenchmarkCell, source: str) -> tuple[int, bool]:
    """Store `cell`; returns (row id, created)."""
    started = iso(cell.started_at)
    key = cell_key(cell.model.model_id, cell.variant.key, cell.profile.name, started)
    row = _stored(session, BenchmarkCellRow, BenchmarkCellRow.cell_key, key, f"cell {key}")
    created = row is None
    if row is None:
        row = BenchmarkCellRow(
            cell_key=key,
            model=cell.model.model_id,
            variant=cell.variant.key,
            started=started,
            profile=cell.profile.name,
        )
    device, label = environment_summary(cell)
    row.finished = iso(cell.finished_at) if cell.finished_at else None
    row.command = " ".join(cell.command)
    row.device = device
    row.env_label = label
    row.env_json = _dumps(cell.environment)
    row.raw_json = cell.model_dump_json(by_alias=True)
    row.source = source
    row.ingested_at = _now()
    row.cell_id = cell.cell_id
    row.profile = cell.profile.name
    row.status = cell.status
    session.add(row)
    session.flush()
    assert row.id is not None
    session.exec(delete(WorkloadRow).where(WorkloadRow.cell_id == row.id))  # type: ignore[arg-type]
    for name, w in cell.workloads.items():
        detail = w.detail if isinstance(w.detail, str) or w.detail is None else _dumps(w.detail)
        session.add(
            WorkloadRow(
                cell_id=row.id,
                workload=name,
                status=w.status,
                metrics_json=_dumps(w.metrics),
                detail=detail or "",
            )
        )
    return row.id, created


def upsert_validator(session: Session, result: ValidatorResult, source: str) -> tuple[int, bool]:
    """Store `result`; returns (row id, created)."""
    key = run_key(result.hf_id, result.engine, iso(result.captured_at))
    row = _stored(session, ValidatorRunRow, ValidatorRunRow.run_key, key, f"run {key}")
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
    row.family = result.family
    row.error = result.error
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
                engine_hook=p.engine_hook,
            )
        )
    return row.id, created


def upsert_graph(session: Session, data: Any, source: str) -> tuple[int, bool]:
    """Store an attribution graph (parsed JSON); returns (row id, created).

    Checked first (`graphs.check_graph` raises GraphError with the reason), so a malformed graph
    writes nothing.
    """
    doc = check_graph(data)
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    key = graph_key(doc.slug, hashlib.sha256(canonical.encode()).hexdigest())
    row = _stored(session, GraphRow, GraphRow.graph_key, key, f"graph {key}")
    created = row is None
    if row is None:
        row = GraphRow(graph_key=key, slug=doc.slug, n_nodes=0, n_links=0, raw_json="{}")
    row.scan = doc.scan
    row.prompt = doc.prompt
    row.node_threshold = doc.node_threshold
    row.n_nodes = len(doc.nodes)
    row.n_links = len(doc.links)
    row.raw_json = canonical
    row.source = source
    row.ingested_at = _now()
    session.add(row)
    session.flush()
    assert row.id is not None
    return row.id, created


def replace_record(
    session: Session, source: str, sections: list[Section], raw: bytes, first: int
) -> int:
    """Store the sections read from one record file in place of what it gave before; returns
    how many. The caller reads the whole file first, so a malformed one never reaches here."""
    claim(session, f"record {source}")
    session.exec(delete(WorkloadRecordRow).where(WorkloadRecordRow.source == source))  # type: ignore[arg-type]
    digest = hashlib.sha256(raw).hexdigest()
    for i, section in enumerate(sections):
        session.add(
            WorkloadRecordRow(
                record_key=record_key(source, section.key),
                source=source,
                section=section.key,
                position=first + i,
                section_json=_dumps(section.to_json()),
                raw_sha256=digest,
                ingested_at=_now(),
            )
        )
    return len(sections)
