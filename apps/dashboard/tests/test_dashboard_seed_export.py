"""Seeding from committed JSON, and the static export: every page written, every link resolving."""

from __future__ import annotations

import posixpath
import re
import shutil
from pathlib import Path
from urllib.parse import urldefrag

import pytest
from dashboard_fixtures import make_cell, make_result, write_json
from ie_core.grammar import FAMILIES, POINTS
from ie_dashboard.cli import dashboard_command
from ie_dashboard.config import database_url
from ie_dashboard.db import Database
from ie_dashboard.export import ExportError, export_site
from ie_dashboard.seed import seed
from ie_dashboard.tables import BenchmarkCellRow, ValidatorRunRow
from sqlmodel import func, select

SWEEP = "benchmarks/results/patching_sweep.json"


def _repo(root: Path) -> Path:
    """A workspace-shaped folder with two cells, two results, and files that are not results."""
    for variant, one, conc in (("eager", 20.0, 18.0), ("vllm", 30.0, 140.0)):
        write_json(
            root / f"benchmarks/cells/cpu/smollm2-135m__{variant}.json",
            make_cell(variant=variant, decode=one, aggregate=conc),
        )
    write_json(root / "validator/results/ie-synthetic__llama/nnsight.json", make_result())
    write_json(
        root / "validator/results/ie-synthetic__llama/vllm.json",
        make_result(engine="vllm", verdict="warn"),
    )
    write_json(
        root / "validator/results/matrix.json", {"models": [], "engines": []}
    )  # an aggregate
    (root / "benchmarks/cells/cpu/.tmp-123.json").write_text("{half a file")  # a writer mid-write
    (root / SWEEP).parent.mkdir(parents=True)
    shutil.copy(Path(__file__).resolve().parents[3] / SWEEP, root / SWEEP)  # a workload record
    return root


def _counts(db: Database) -> tuple[int, int]:
    with db.read() as s:
        cells = s.exec(select(func.count()).select_from(BenchmarkCellRow)).one()
        runs = s.exec(select(func.count()).select_from(ValidatorRunRow)).one()
    return cells, runs


def test_seed_is_idempotent_and_reports_bad_files(tmp_path: Path) -> None:
    root = _repo(tmp_path / "repo")
    db = Database(database_url(tmp_path / "d.sqlite"))
    report = seed(db, root)
    assert (report.architectures, report.cells, report.results) == (len(FAMILIES), 2, 2)
    assert report.errors == [] and any("matrix.json" in s for s in report.skipped)
    assert seed(db, root).cells == 2
    assert _counts(db) == (2, 2)
    bad = make_cell(variant="vllm-static")
    del bad["workloads"]["generate"]["status"]
    write_json(root / "benchmarks/cells/cpu/bad.json", bad)
    report = seed(db, root)
    assert report.errors == [
        "benchmarks/cells/cpu/bad.json: workloads.generate.status: Field required"
    ]
    assert _counts(db) == (2, 2)
    db.dispose()


def test_cli_seed_exit_status(tmp_path: Path) -> None:
    root = _repo(tmp_path / "repo")
    db = str(tmp_path / "cli.sqlite")
    assert dashboard_command(["seed", "--db", db, "--root", str(root)]) == 0
    write_json(
        root / "validator/results/x/bad.json", {"hf_id": "x", "engine": "y", "verdict": "maybe"}
    )
    assert dashboard_command(["seed", "--db", db, "--root", str(root)]) == 1


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("export")
    root = _repo(base / "repo")
    out = base / "site"
    assert dashboard_command(["export", "--out", str(out), "--root", str(root)]) == 0
    return out


def test_export_prerenders_every_page(site: Path) -> None:
    for f in FAMILIES:
        assert (site / f"cheatsheet/{f.slug}/index.html").exists()
        for p in POINTS:
            assert (site / f"cheatsheet/{f.slug}/{p.name}.html").exists()
    n = len(FAMILIES)
    assert len(list((site / "compare").glob("*.html"))) == n * (n - 1) // 2
    assert (site / "throughput/index.html").exists() and (site / "validation/index.html").exists()
    assert len(list((site / "validation").glob("*__*.html"))) == 2
    assert {p.name for p in (site / "data").iterdir()} == {
        "points.json", "architectures.json", "benchmarks.json", "validator.json", "workloads.json"
    }  # fmt: skip
    card = (site / "cheatsheet/llama/resid_post.html").read_text()
    assert 'data-point="resid_post"' in card and "blocks.{L}.hook_resid_post" in card
    tput = (site / "throughput/index.html").read_text()
    assert "1.5x" in tput and "7.8x" in tput  # 30 / 20 and 140 / 18
    assert 'id="wl-patch-sweep"' in tput and "index.html#wl-patch-sweep" in tput
    assert "htmx" not in (site / "index.html").read_text()


def test_export_links_resolve_without_a_server(site: Path) -> None:
    """Every href and src in every page is relative and points at a file that exists."""
    files = {p.relative_to(site).as_posix() for p in site.rglob("*") if p.is_file()}
    pages = sorted(f for f in files if f.endswith(".html"))
    assert len(pages) > len(FAMILIES) * len(POINTS)
    for page in pages:
        html = (site / page).read_text()
        assert "hx-get" not in html, page
        for ref in set(re.findall(r'(?:href|src)="([^"]+)"', html)):
            target, _ = urldefrag(ref)
            assert not target.startswith(("/", "http")), f"{page}: {ref}"
            assert posixpath.normpath(posixpath.join(posixpath.dirname(page), target)) in files, (
                f"{page}: {ref}"
            )


def test_export_refuses_a_folder_it_did_not_write(tmp_path: Path) -> None:
    (tmp_path / "mine.txt").write_text("keep me")
    db = Database(database_url(tmp_path / "d.sqlite"))
    db.migrate()
    with pytest.raises(ExportError, match="did not write"):
        export_site(db, tmp_path)
    assert (tmp_path / "mine.txt").read_text() == "keep me"
    db.dispose()


def test_serve_seeds_an_empty_database_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uvicorn

    served: list[tuple[str, int]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, host, port, **kw: served.append((host, port)))
    root = _repo(tmp_path / "repo")
    db_file = tmp_path / "serve.sqlite"
    argv = ["--host", "127.0.0.2", "--port", "9123", "--db", str(db_file), "--root", str(root)]
    assert dashboard_command(argv) == 0
    assert served == [("127.0.0.2", 9123)]
    db = Database(database_url(db_file))
    assert _counts(db) == (2, 2)
    # Not empty any more: a restart does not re-read the JSON (a new file stays out until `seed`).
    write_json(
        root / "validator/results/ie-synthetic__gpt2/nnsight.json",
        make_result(hf_id="ie-synthetic/gpt2"),
    )
    assert dashboard_command(argv) == 0
    assert _counts(db) == (2, 2)
    db.dispose()
