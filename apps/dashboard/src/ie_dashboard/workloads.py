"""Read model of the throughput page's workload sections: each workload with its peers.

Two sources, one shape (`records.Section`): the non-generation workloads inside the benchmark
cells (`capture_all`, `steer`, ...; peers are the cell variants), built here from the stored
cells, and the workload records `seed` read (`records.RECORDS`; peers as the record names them).
"""

from __future__ import annotations

import json
import re

from sqlmodel import Session, col, select

from ie_dashboard import views
from ie_dashboard.records import Bar, Section
from ie_dashboard.tables import BenchmarkCellRow, WorkloadRecordRow

__all__ = ["CELL_WORKLOADS", "cell_sections", "record_sections", "workload_sections"]

# The headline metric of each cell workload besides generation (which has its own cards), with
# its unit and direction. Cells store metric values only; these follow ie-bench's spec
# (`ie_bench.spec.WORKLOADS[].headline` / `.metrics`), which a test checks this table against.
CELL_WORKLOADS: dict[str, tuple[str, str, bool]] = {
    "capture_mid": ("latency_s", "s", True),
    "capture_all": ("latency_s", "s", True),
    "capture_gen": ("latency_s", "s", True),
    "steer": ("latency_s", "s", True),
    "lens_topk": ("latency_s", "s", True),
}
CELL_LOAD_NOTE = (
    "per bar: the highest 1-minute load the cell recorded; 'under load' marks one above the "
    "publish gate's bound (one per core)"
)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def cell_sections(session: Session) -> list[Section]:
    """Per (model, profile) and cell workload, the latest cell of each variant as one bar."""
    by_group: dict[tuple[str, str], list[tuple[str, BenchmarkCellRow]]] = {}
    for (model, profile, variant), cell in sorted(
        views.latest_cells(session).items(),
        key=lambda kv: (kv[0][0], kv[0][1], views.variant_key(kv[0][2])),
    ):
        by_group.setdefault((model, profile), []).append((variant, cell))
    out: list[Section] = []
    for (model, profile), cells in by_group.items():
        rows = {variant: views.cell_workloads(session, cell) for variant, cell in cells}
        for workload, (metric, unit, lower) in CELL_WORKLOADS.items():
            bars = []
            for variant, cell in cells:
                value, status = views.metric(cell, rows[variant], (workload, metric))
                load = views.stored_cell_load(json.loads(cell.raw_json))
                loaded = load is not None and not load.within_bound
                note = (f"under load: {load.label()}" if loaded else load.label()) if load else ""
                bars.append(Bar(variant, metric, value, status, note))
            if all(b.value is None for b in bars):
                continue  # no variant measured it (older cells, or refused everywhere)
            sources = sorted({c.source.rpartition("/")[0] or c.source for _, c in cells})
            out.append(
                Section(
                    f"cell-{_slug(workload)}-{_slug(model)}-{_slug(profile)}",
                    f"{workload}: {model}",
                    unit,
                    lower,
                    f"ie bench's {workload} workload ({metric}), profile {profile}; the latest "
                    "cell of each variant",
                    (metric,),
                    tuple(bars),
                    command="ie bench cell (one cell per variant)",
                    load=CELL_LOAD_NOTE,
                    source=", ".join(f"{s}/" for s in sources),
                )
            )
    return out


def record_sections(session: Session) -> list[Section]:
    rows = session.exec(select(WorkloadRecordRow).order_by(col(WorkloadRecordRow.position))).all()
    return [Section.from_json(json.loads(r.section_json)) for r in rows]


def workload_sections(session: Session) -> list[Section]:
    return cell_sections(session) + record_sections(session)
