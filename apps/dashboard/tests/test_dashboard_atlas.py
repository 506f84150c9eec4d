"""Feature pages from an `ie atlas` folder: `ie dashboard atlas DIR` stores it, `/atlases/{id}` is
a dictionary's index (density, max activation, search by id and by top token, paginated through
an index, never the whole table) and `/atlases/{id}/features/{f}` a feature's page.

The folder is a 16,384-feature atlas written by `atlas_synthetic.py` (random sparse activations
reduced by the real state, in the real layout); what the pages show is checked against a brute
force over those activations (`torch.topk`, counts, max), not against the atlas reader.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from atlas_fixtures import D_SAE, SCAN, decode, synthetic_atlas
from dashboard_fixtures import make_graph
from fastapi.testclient import TestClient
from ie_dashboard.app import create_app
from ie_dashboard.atlas_import import AtlasImportError, import_atlas
from ie_dashboard.atlas_pages import PAGE_SIZE, SORTS, atlas_row, index_query
from ie_dashboard.cli import dashboard_command
from ie_dashboard.config import database_url
from ie_dashboard.db import Database
from ie_dashboard.ingest import upsert_graph
from ie_dashboard.tables import AtlasFeatureRow, AtlasRow
from sqlalchemy import text
from sqlmodel import func, select

torch = pytest.importorskip("torch")
PAGE_SECONDS = 2.0  # a page of a 16k-feature atlas, generous for 2 loaded cores


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("atlas")
    data = synthetic_atlas(tmp / "atlas")
    db = Database(database_url(tmp / "d.sqlite"))
    db.migrate()
    start = time.perf_counter()
    with db.write() as session:
        atlas_id, created = import_atlas(session, data.folder, decode)
    print(f"imported {D_SAE} features in {time.perf_counter() - start:.1f}s (under load)")
    assert created
    with db.write() as session:
        upsert_graph(session, linked_graph(), source="test")
    return {
        "db": db,
        "data": data,
        "id": atlas_id,
        "client": TestClient(create_app(db, token=None)),
    }


def linked_graph(scan: str = SCAN) -> dict[str, Any]:
    """`make_graph` with its two features moved to layer 5 (the atlas's layer: ids `5_3_1` and
    `5_4_2`, `feature` the Cantor pairing of layer and index as ie trace and circuit-tracer write
    it) and the atlas's scan."""
    graph = make_graph("linked")
    graph["metadata"]["scan"] = scan
    renamed = {"0_3_1": "5_3_1", "1_4_2": "5_4_2"}
    for node in graph["nodes"]:
        if node["node_id"] in renamed:
            node["node_id"] = renamed[node["node_id"]]
            index = int(node["node_id"].split("_")[1])
            node["layer"], node["feature"] = "5", (5 + index) * (6 + index) // 2 + index
    for link in graph["links"]:
        link["source"] = renamed.get(link["source"], link["source"])
        link["target"] = renamed.get(link["target"], link["target"])
    return graph


def _brute(data: Any, f: int) -> dict[str, Any]:
    acts = data.acts[..., f].flatten()
    fired = int((acts > 0).sum())
    top = torch.topk(acts, data.state.k)
    return {"fired": fired, "density": fired / acts.numel(), "max": float(acts.max()),
            "top": [float(v) for v in top.values if v > 0]}  # fmt: skip


def _numbers(page: str, css: str) -> list[float]:
    return [float(x) for x in re.findall(rf'<span class="{css}[^"]*">([-0-9.e+]+)</span>', page)]


def test_index_lists_a_page_of_features_with_density_and_max(stored: dict[str, Any]) -> None:
    client, data = stored["client"], stored["data"]
    r = client.get(f"/atlases/{stored['id']}")
    assert r.status_code == 200
    rows = re.findall(r'<tr><td class="num"><a href="/atlases/\d+/features/(\d+)">', r.text)
    assert [int(x) for x in rows] == list(range(PAGE_SIZE))
    assert f"page 1 of {D_SAE // PAGE_SIZE + 1}" in r.text
    with stored["db"].read() as s:
        row = s.exec(select(AtlasFeatureRow).where(AtlasFeatureRow.feature == 7)).one()
    want = _brute(data, 7)
    assert row.fired == want["fired"]
    assert row.density == pytest.approx(want["density"], rel=1e-12)
    assert row.max_act == pytest.approx(want["max"], rel=1e-6)
    # Sorted by density: the first row is the densest feature (ties: the higher id first).
    dense = client.get(f"/atlases/{stored['id']}?sort=density").text
    first = int(re.search(r"/features/(\d+)", dense.split("<tbody>")[1]).group(1))  # type: ignore[union-attr]
    counts = (data.acts > 0).sum(dim=(0, 1))
    top = int(counts.max())
    assert first == max(i for i, c in enumerate(counts.tolist()) if c == top)
    last = client.get(f"/atlases/{stored['id']}?page={D_SAE // PAGE_SIZE + 1}").text
    assert f'/features/{D_SAE - 1}"' in last and "next →" not in last


def test_feature_page_matches_a_brute_force(stored: dict[str, Any]) -> None:
    client, data = stored["client"], stored["data"]
    counts = (data.acts > 0).sum(dim=(0, 1))
    f = int(counts.argmax())
    page = client.get(f"/atlases/{stored['id']}/features/{f}").text
    want = _brute(data, f)
    shown = _numbers(page, "ctxval num")
    assert shown[: len(want["top"])] == pytest.approx(want["top"], rel=1e-3)  # printed to 3 digits
    assert f"{want['fired']:,} of" in page
    # The peak token of each top context is the window's token at that position, decoded.
    with stored["db"].read() as s:
        row = s.exec(select(AtlasFeatureRow).where(AtlasFeatureRow.feature == f)).one()
    body = json.loads(row.page_json)
    flat = data.acts[..., f]
    for ctx in body["top"]:
        w, p = ctx["sequence"], ctx["position"]
        assert ctx["value"] == pytest.approx(float(flat[w, p]), rel=1e-6)
        assert ctx["tokens"][p - ctx["start"]] == decode(int(data.tokens[w, p]))
        assert ctx["acts"] == pytest.approx(flat[w, ctx["start"] : ctx["start"] + len(ctx["acts"])].tolist(), rel=1e-6)  # fmt: skip
    # Tokens shaded by activation: the peak is fully opaque, a zero transparent.
    assert 'class="t peak" style="background:rgba(255,140,0,1.00)"' in page
    assert "rgba(255,140,0,0.00)" in page
    bars = re.findall(r"<rect class=\"hbar\"[^>]*><title>([^<]*): ([0-9,]+)</title>", page)
    assert sum(int(n.replace(",", "")) for _, n in bars) == want["fired"]
    assert "promotes" in page and "suppresses" in page


def test_search_by_id_and_by_top_token(stored: dict[str, Any]) -> None:
    client = stored["client"]
    r = client.get(f"/atlases/{stored['id']}", params={"q": "12345"})
    assert re.findall(r"/features/(\d+)\"", r.text) == ["12345"]
    with stored["db"].read() as s:
        token = s.exec(select(AtlasFeatureRow.top_token).where(AtlasFeatureRow.feature == 3)).one()
        want = s.exec(
            select(AtlasFeatureRow.feature)
            .where(AtlasFeatureRow.token_key == token.strip().casefold())
            .order_by(AtlasFeatureRow.feature)
        ).all()
    r = client.get(f"/atlases/{stored['id']}", params={"q": token.strip().upper()})
    found = [int(x) for x in re.findall(r"/features/(\d+)\"", r.text)]
    assert 3 in found and set(want[:PAGE_SIZE]) <= set(found)
    assert "no feature" in client.get(f"/atlases/{stored['id']}", params={"q": "zzzz-none"}).text
    assert "no feature 99999" in client.get(f"/atlases/{stored['id']}", params={"q": "99999"}).text


@pytest.mark.parametrize(
    "path",
    [
        "/atlases/x", "/atlases/0", "/atlases/99", "/atlases/-1", "/atlases/1?page=0",
        "/atlases/1?page=abc", "/atlases/1?page=9999", "/atlases/1?sort=random",
        "/atlases/1/features/abc", "/atlases/1/features/-1", f"/atlases/1/features/{D_SAE}",
        "/atlases/1/features/99999999999999999999", "/atlases/2/features/0",
        "/atlases/1?page=１", "/atlases/1/features/１",
    ],
)  # fmt: skip
def test_malformed_input_is_a_404_page_saying_why(stored: dict[str, Any], path: str) -> None:
    r = stored["client"].get(path)
    assert r.status_code == 404, (path, r.status_code)
    assert re.search(r"no atlas|not a whole number|no page|unknown sort|no feature", r.text), r.text


def test_pages_read_a_page_through_an_index(stored: dict[str, Any]) -> None:
    """The SQL of each index page walks an index with a LIMIT: no full scan, no sort."""
    db = stored["db"]
    with db.read() as s:
        atlas = atlas_row(s, str(stored["id"]))
        queries = [index_query(atlas, 300, sort, "") for sort in SORTS]
        queries += [index_query(atlas, 2, "feature", " w1"), index_query(atlas, 1, "feature", "77")]
        for q in queries:
            sql = str(q.compile(db.engine, compile_kwargs={"literal_binds": True}))
            plan = " | ".join(
                r[-1] for r in s.connection().execute(text(f"EXPLAIN QUERY PLAN {sql}"))
            )
            assert "USING" in plan and "INDEX" in plan, plan
            assert "TEMP B-TREE" not in plan, plan
            assert "LIMIT" in sql or "feature =" in sql
    # And fast: a page of the index and a feature page, timed (under load, so bounds are loose).
    client = stored["client"]
    for path in (
        f"/atlases/{stored['id']}?page=300&sort=density",
        f"/atlases/{stored['id']}/features/16000",
    ):
        start = time.perf_counter()
        assert client.get(path).status_code == 200
        took = time.perf_counter() - start
        print(f"{path}: {took * 1000:.0f} ms (under load)")
        assert took < PAGE_SECONDS, (path, took)


def test_the_same_folder_twice_is_one_atlas(stored: dict[str, Any]) -> None:
    with stored["db"].write() as session:
        again, created = import_atlas(session, stored["data"].folder, decode)
    assert (again, created) == (stored["id"], False)
    with stored["db"].read() as s:
        assert s.exec(select(func.count()).select_from(AtlasRow)).one() == 1
        assert s.exec(select(func.count()).select_from(AtlasFeatureRow)).one() == D_SAE


def test_a_graph_node_links_to_its_feature_page(stored: dict[str, Any]) -> None:
    client = stored["client"]
    graphs = client.get("/api/graphs").json()
    graph_id = next(g["id"] for g in graphs if g["slug"] == "linked")
    node = client.get("/fragments/graph-node", params={"graph": graph_id, "node": "5_4_2"}).text
    assert f'href="/atlases/{stored["id"]}/features/4"' in node  # index 4 (its `feature` is 49)
    page = client.get(f"/graphs/{graph_id}").text
    assert f'href="/atlases/{stored["id"]}/features/3"' in page  # the top-features table
    assert "/features/49" not in page and "/features/39" not in page  # not the Cantor values
    # Negative control: a graph of another transcoder set links to nothing.
    with stored["db"].write() as session:
        other, _ = upsert_graph(session, linked_graph("another-set"), source="test")
    assert "/features/" not in client.get(f"/graphs/{other}", params={"node": "5_4_2"}).text


def test_the_command_stores_nothing_from_a_folder_that_is_not_an_atlas(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "atlas.json").write_text(
        json.dumps({"format": "ie-atlas/1", "spec": {}, "complete": False})
    )
    db = tmp_path / "d.sqlite"
    rc = dashboard_command(
        ["atlas", str(tmp_path / "half"), str(tmp_path / "none"), "--db", str(db)]
    )
    err = capsys.readouterr().err
    assert rc == 1
    assert "the pass did not finish" in err and "no finished atlas" in err
    database = Database(database_url(db))
    with database.read() as s:
        assert s.exec(select(func.count()).select_from(AtlasRow)).one() == 0
    database.dispose()
    with (
        pytest.raises(AtlasImportError, match="no finished atlas"),
        Database(database_url(db)).write() as session,
    ):
        import_atlas(session, tmp_path / "half", decode)


def test_import_and_pages_on_each_database(db_url: str, tmp_path: Path) -> None:
    """SQLite and PostgreSQL: the import, a sorted page, both searches and a 404."""
    data = synthetic_atlas(tmp_path / "atlas", d_sae=64)
    db = Database(db_url)
    db.migrate()
    with db.write() as session:
        atlas_id, _ = import_atlas(session, data.folder, decode)
    client = TestClient(create_app(db, token=None))
    dense = client.get(f"/atlases/{atlas_id}", params={"sort": "max"})
    assert dense.status_code == 200 and len(re.findall(r"/features/\d+\"", dense.text)) == 50
    assert re.findall(r"/features/(\d+)\"", client.get(f"/atlases/{atlas_id}?q=63").text) == ["63"]
    with db.read() as s:
        token = s.exec(select(AtlasFeatureRow.top_token).where(AtlasFeatureRow.feature == 5)).one()
    found = client.get(f"/atlases/{atlas_id}", params={"q": token.upper()}).text
    assert '/features/5"' in found
    assert client.get(f"/atlases/{atlas_id}/features/63").status_code == 200
    assert client.get(f"/atlases/{atlas_id}/features/64").status_code == 404
    for q in ("4294967296", "²", "１２"):  # past the column's range; digits int() refuses or reads
        assert client.get(f"/atlases/{atlas_id}", params={"q": q}).status_code == 200, q
    db.dispose()
