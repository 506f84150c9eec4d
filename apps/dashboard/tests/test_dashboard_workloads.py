"""The throughput page's workload cards, from this repository's committed records: every record
`records.RECORDS` names is ingested by `seed` and drawn with its peers, with the figures the
record files hold (read here from the files, independently of the readers). A malformed record
is refused with the field named and leaves what was stored before."""

from __future__ import annotations

import html
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from ie_dashboard.app import create_app
from ie_dashboard.charts import fmt_rate
from ie_dashboard.cli import dashboard_command
from ie_dashboard.config import database_url
from ie_dashboard.db import Database
from ie_dashboard.records import RECORDS
from ie_dashboard.seed import seed
from ie_dashboard.tables import WorkloadRecordRow
from ie_dashboard.workloads import CELL_WORKLOADS
from sqlmodel import select

ROOT = Path(__file__).resolve().parents[3]
CELLS = "benchmarks/cells"
SWEEP = "benchmarks/results/patching_sweep.json"


def _copy_records(dest: Path) -> Path:
    """The committed records and cells in a folder of their own (no validator results: faster)."""
    for spec in RECORDS:
        (dest / spec.path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / spec.path, dest / spec.path)
    shutil.copytree(ROOT / CELLS, dest / CELLS)
    (dest / "validator/results").mkdir(parents=True)
    return dest


def _load(rel: str) -> Any:
    return json.loads((ROOT / rel).read_text())


def _expected() -> dict[str, list[tuple[str, float]]]:
    """Per section key, (peer, figure) pairs read straight from the record files."""
    sweep, sae = _load(SWEEP), _load("packages/ie-vllm/benchmarks/results/sae_features.json")
    harvest = _load("benchmarks/harvest-results/harvest_throughput.json")
    steer = _load("packages/ie-vllm/benchmarks/results/steering_configs.json")
    ct = _load("docs/notes/circuit_tracing_bench.json")
    static = _load("docs/notes/static_bench_cpu.json")
    quant = _load("benchmarks/results/quantized_throughput.json")
    over = _load("packages/ie-eager/benchmarks/results/capture_overhead-wall-1t.json")
    return {
        "patch-sweep": [(r["engine"], r["wall_s"]) for r in sweep["rows"]],
        "dictionary-readout": [
            (p, v["tok_per_s"]) for p, by in sae["results"].items() for v in by.values()
        ],
        "harvest": [(p, v) for p, by in harvest["tokens_per_s"].items() for v in by.values()],
        "steering": [
            (p, v["tok_per_s"])
            for p, by in steer["results"].items()
            for v in by.values()
            if isinstance(v, dict)
        ],
        "circuit-tracing": [
            ("ie eager", ct["rounds"][-1]["ie_eager"]["single_seconds"]),
            ("ie vllm", ct["rounds"][-1]["ie_vllm"]["single_seconds"]),
            ("circuit-tracer", ct["rounds"][-1]["circuit_tracer"]["single_seconds"]),
        ],
        "circuit-tracing-batch": [
            ("ie eager", ct["rounds"][-1]["ie_eager"]["graphs_per_minute"]),
            ("ie vllm", ct["rounds"][-1]["ie_vllm"]["graphs_per_minute"]),
            ("circuit-tracer", ct["rounds"][-1]["circuit_tracer"]["graphs_per_minute"]),
        ],
        "static-vs-generate": [
            (p, v) for p in ("vllm-static", "vllm-generate") for v in static[p]["generate"].values()
        ],
        "quantized": [
            (f"{c['backend']} {c['model']}", c[k])
            for c in quant["cells"]
            for k in ("decode_tok_s", "capture_tok_s")
            if c[k] is not None
        ],
        "capture-overhead": [
            (p, v["median_ms"]) for by in over["lengths"].values() for p, v in by.items()
        ],
    }


def _sections(page: str) -> dict[str, dict[str, list[str]]]:
    """Section key -> peer -> the figures its table row shows."""
    out: dict[str, dict[str, list[str]]] = {}
    for key, body in re.findall(
        r'<section class="model workload" id="wl-([^"]+)".*?>(.*?)</section>', page, re.S
    ):
        rows = re.findall(r'<tr data-peer="([^"]+)">(.*?)</tr>', body, re.S)
        out[key] = {
            html.unescape(peer): re.findall(r'<td class="num">\s*(.*?)\s*</td>', row, re.S)
            for peer, row in rows
        }
        out[key]["__body__"] = [body]
    return out


@pytest.fixture(scope="module")
def real_page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = _copy_records(tmp_path_factory.mktemp("records"))
    db = Database(database_url(root / "d.sqlite"))
    report = seed(db, root)
    assert report.errors == [] and report.records == len(RECORDS), report.summary()
    with TestClient(create_app(db, token=None)) as client:
        page = client.get("/throughput")
        assert page.status_code == 200
        yield page.text
    db.dispose()


def test_every_record_is_a_card_with_its_figures(real_page: str) -> None:
    sections = _sections(real_page)
    expected = _expected()
    assert {s.path for s in RECORDS} <= {
        m for body in sections.values() for m in re.findall(r"record <code>([^<]+)</code>", body["__body__"][0])
    }  # fmt: skip
    for key, figures in expected.items():
        assert key in sections, f"no card for {key}"
        for peer, value in figures:
            assert fmt_rate(value) in sections[key][peer], (key, peer, value, sections[key][peer])
    # The patch sweep grid's size comes from its record; a missing figure shows why.
    assert f"{_load(SWEEP)['rows'][0]['cells']}-cell grid" in real_page
    assert sections["quantized"]["vllm-generate ie-synthetic/llama"][1] == "refused"


def test_measured_alone_only_where_the_record_says_so(real_page: str) -> None:
    sections = _sections(real_page)
    alone = {k for k, s in sections.items() if "measured alone</span>" in s["__body__"][0]}
    assert alone == {
        "harvest",
        "dictionary-readout",
        "circuit-tracing",
        "circuit-tracing-batch",
        "capture-overhead",
    }
    assert "the record logs no load" in sections["static-vs-generate"]["__body__"][0]
    harvest = _load("benchmarks/harvest-results/harvest_throughput.json")
    assert html.escape(harvest["measured_alone"]["command"]) in sections["harvest"]["__body__"][0]


def test_cell_workloads_have_their_variants_side_by_side(real_page: str) -> None:
    sections = _sections(real_page)
    for path in sorted((ROOT / CELLS).rglob("*.json")):
        cell = json.loads(path.read_text())
        for workload, (metric, _unit, _lower) in CELL_WORKLOADS.items():
            key = f"cell-{workload.replace('_', '-')}-huggingfacetb-smollm2-135m-instruct-cpu"
            w = cell["workloads"][workload]
            shown = sections[key][cell["variant"]["key"]][0]
            want = fmt_rate(w["metrics"][metric]) if w["status"] == "ok" else w["status"]
            assert shown == want, (key, cell["variant"]["key"])


def test_the_cell_workload_table_follows_ie_bench_spec() -> None:
    spec = pytest.importorskip("ie_bench.spec")
    for w in spec.WORKLOADS:
        if w.key in ("generate", "generate_x8"):
            continue  # the generation cards
        metric = next(m for m in w.metrics if m.key == w.headline)
        assert CELL_WORKLOADS[w.key] == (metric.key, metric.unit, metric.direction == "lower")


def _stored(db: Database) -> list[str]:
    with db.read() as s:
        return [r.section_json for r in s.exec(select(WorkloadRecordRow))]


def _set_wall(value: Any) -> Any:
    """Damage the third row's (transformer-lens) grid time."""

    def damage(text: str) -> str:
        data = json.loads(text)
        data["rows"][2]["wall_s"] = value
        return json.dumps(data)

    return damage


@pytest.mark.parametrize(
    ("damage", "error"),
    [
        (_set_wall("slow"), "rows[2].wall_s: expected a number, got str"),
        (_set_wall(-1), "rows[2].wall_s: -1 is not a finite number >= 0"),
        (_set_wall(float("nan")), "not strict JSON"),
        (_set_wall({"s": 1}), "rows[2].wall_s: expected a number, got dict"),
        (lambda t: t.replace('"rows"', '"rowz"', 1), "rows: missing"),
        (lambda t: t[: len(t) // 2], "not strict JSON"),
        (lambda t: "[1, 2]", "expected a JSON object, got list"),
    ],
)
def test_a_malformed_record_is_refused_and_loses_nothing(
    tmp_path: Path, damage: Any, error: str
) -> None:
    root = tmp_path / "repo"
    (root / "benchmarks/results").mkdir(parents=True)
    (root / "validator/results").mkdir(parents=True)
    good = (ROOT / SWEEP).read_text()
    (root / SWEEP).write_text(good)
    db = Database(database_url(tmp_path / "d.sqlite"))
    assert seed(db, root).errors == []
    before = _stored(db)
    assert len(before) == 1
    (root / SWEEP).write_text(damage(good))
    report = seed(db, root)
    assert len(report.errors) == 1 and report.errors[0].startswith(f"{SWEEP}: ")
    assert error in report.errors[0], report.errors
    assert _stored(db) == before
    db.dispose()
    assert dashboard_command(["seed", "--db", str(tmp_path / "d.sqlite"), "--root", str(root)]) == 1
