"""`ie dashboard export`: the static site (every page pre-rendered, relative links, no server)."""

from __future__ import annotations

import json
import shutil
from importlib.resources import files
from pathlib import Path

from sqlmodel import select

from ie_dashboard import render, views
from ie_dashboard.app import _arch_json, _cell_json, _run_json
from ie_dashboard.db import Database
from ie_dashboard.links import Links
from ie_dashboard.tables import BenchmarkCellRow, ValidatorRunRow

MARKER = ".ie-dashboard-export"


class ExportError(RuntimeError):
    pass


def _prepare(out: Path) -> None:
    """Empty `out`, but only if it is empty already or was written by a previous export."""
    if out.exists():
        if any(out.iterdir()) and not (out / MARKER).exists():
            raise ExportError(f"{out} holds files this command did not write; choose another --out")
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / MARKER).write_text(
        "written by `ie dashboard export`; the folder is replaced on each export\n"
    )


def _write(out: Path, rel: str, text: str) -> None:
    path = out / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def export_site(db: Database, out: Path) -> int:
    """Write every page under `out`; returns the number of files written."""
    _prepare(out)
    shutil.copytree(str(files("ie_dashboard") / "static"), out / "static")
    top, one, two = Links.for_static_page(0), Links.for_static_page(1), Links.for_static_page(2)
    count = 0
    with db.read() as s:
        archs = views.list_architectures(s)
        _write(out, "index.html", render.cheatsheet(s, top, render.DEFAULT_ARCH))
        count += 1
        for a in archs:
            _write(out, f"cheatsheet/{a.slug}/index.html", render.cheatsheet(s, two, a.slug))
            count += 1
            for p in views.list_points(s):
                _write(
                    out,
                    f"cheatsheet/{a.slug}/{p.name}.html",
                    render.cheatsheet(s, two, a.slug, p.name),
                )
                count += 1
        for i, a in enumerate(archs):
            for b in archs[i + 1 :]:
                _write(
                    out, f"compare/{a.slug}--{b.slug}.html", render.compare(s, one, a.slug, b.slug)
                )
                count += 1
        _write(out, "throughput/index.html", render.throughput(s, one))
        _write(out, "validation/index.html", render.validation(s, one))
        count += 2
        matrix = views.validation_matrix(s)
        for model, engine in matrix.cells:
            rel = one.validation_run(model, engine).removeprefix(one.root)
            _write(out, rel, render.validation_run(s, one, model, engine))
            count += 1
        data = {
            "points.json": [p.model_dump() for p in views.list_points(s)],
            "architectures.json": [_arch_json(views.get_architecture(s, a.slug)) for a in archs],
            "benchmarks.json": [
                _cell_json(s, c)
                for c in s.exec(select(BenchmarkCellRow).order_by(BenchmarkCellRow.id))
            ],
            "validator.json": [
                _run_json(s, r, True)
                for r in s.exec(select(ValidatorRunRow).order_by(ValidatorRunRow.id))
            ],
        }
    for name, value in data.items():
        _write(out, f"data/{name}", json.dumps(value, indent=1, sort_keys=True) + "\n")
        count += 1
    return count
