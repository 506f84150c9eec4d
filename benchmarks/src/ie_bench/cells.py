"""The cell JSON: its schema, where cells live, and reading a directory of them.

A cell is one `(model, variant)` under one profile. Its schema is `ie_core.tooling.records.BenchmarkCell`,
shared with the dashboard that ingests these files, and documented in `benchmarks/README.md`
("Cell JSON").
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ie_core.tooling.records import CELL_SCHEMA, BenchmarkCell, problems

SCHEMA = CELL_SCHEMA


def cell_id(model_key: str, variant_key: str) -> str:
    return f"{model_key}__{variant_key}"


def cell_path(cells_dir: Path, profile: str, model_key: str, variant_key: str) -> Path:
    return cells_dir / profile / f"{cell_id(model_key, variant_key)}.json"


def schema_errors(cell: Any) -> list[str]:
    """What is wrong with a cell dict, as sentences; empty when it matches `ie_core.tooling.records`."""
    if not isinstance(cell, dict):
        return [f"a cell is a JSON object, got {type(cell).__name__}"]
    return problems(BenchmarkCell, cell)


def write_cell(path: Path, cell: dict[str, Any]) -> None:
    """Atomic write, so a cell killed mid-write leaves the previous complete file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w") as fh:
        json.dump(cell, fh, indent=2, sort_keys=True)
        fh.write("\n")
    os.chmod(tmp, 0o644)  # mkstemp makes it 0600; a cell is a result for others to read
    os.replace(tmp, path)


def read_cell(path: Path) -> dict[str, Any]:
    cell = json.loads(path.read_text())
    errors = schema_errors(cell)
    if errors:
        raise ValueError(f"{path} is not a valid cell: " + "; ".join(errors))
    return cell


def load_cells(cells_dir: Path, profile: str | None = None) -> list[dict[str, Any]]:
    """Every cell under `cells_dir` (optionally one profile's folder), sorted by path."""
    root = cells_dir / profile if profile else cells_dir
    if not root.exists():
        return []
    return [read_cell(p) for p in sorted(root.rglob("*.json")) if not p.name.startswith(".")]


def profiles_present(cells: Iterable[dict[str, Any]]) -> list[str]:
    return sorted({c["profile"]["name"] for c in cells})


def metric(cell: dict[str, Any] | None, workload: str, key: str) -> float | None:
    """A measured figure, or None when the cell or workload did not produce it."""
    if cell is None:
        return None
    w = cell["workloads"].get(workload)
    if not w or w["status"] != "ok":
        return None
    value = w["metrics"].get(key)
    return float(value) if value is not None else None
