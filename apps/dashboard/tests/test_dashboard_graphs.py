"""Attribution graphs in the dashboard: a graph traced for real by `ie_core.circuits` on a
synthetic eager model (random per-layer transcoders, as in ie-eager's circuit tests) is stored
through the API and the command line, and its page shows the graph's own nodes, edge weights,
target logits and feature influences; malformed and oversized graphs are refused with the
reason and store nothing."""

from __future__ import annotations

import copy
import html
import json
import re
from pathlib import Path
from typing import Any

import pytest
from dashboard_fixtures import AUTH
from fastapi.testclient import TestClient
from ie_dashboard import graphs
from ie_dashboard.cli import dashboard_command
from ie_dashboard.config import database_url
from ie_dashboard.db import Database
from ie_dashboard.render import fmt_num
from ie_dashboard.tables import GraphRow
from sqlmodel import select

PROMPT = "The capital of France is"
WIDTH = 32  # transcoder features per layer


@pytest.fixture(scope="module")
def graph_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`ie trace`'s output for a synthetic llama: attribute, prune, write_graph_json."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("ie_eager")
    from ie_core.circuits import attribute, load_transcoders, random_transcoder, write_layer_file
    from ie_core.circuits.graph_json import write_graph_json
    from ie_core.circuits.pruning import prune
    from ie_eager.backend import load
    from ie_eager.synthetic import build

    torch.set_num_threads(1)
    model = load(str(build("llama")), device="cpu", dtype="float32")
    folder = tmp_path_factory.mktemp("tc")
    for layer in range(model.n_layers):
        tc = random_transcoder(model.d_model, WIDTH, layer, seed=10 + layer, activation="relu")
        write_layer_file(tc, folder / f"layer_{layer}.safetensors")
    graph = attribute(model, PROMPT, load_transcoders(folder), max_n_logits=4)
    options = {"node_threshold": 0.8, "edge_threshold": 0.98}
    out = tmp_path_factory.mktemp("graph") / "capital.json"
    write_graph_json(
        graph, out, scan="ie-synthetic/llama", pruned=prune(graph, **options), **options
    )
    return out


@pytest.fixture(scope="module")
def graph(graph_file: Path) -> dict[str, Any]:
    return json.loads(graph_file.read_text())


def _svg_numbers(page: str) -> tuple[set[str], dict[tuple[str, str], float]]:
    """Node ids drawn as circles and (source, target) -> weight drawn as lines in the SVG."""
    svg = page[page.index('<svg class="graph"') : page.index("</svg>", page.index('class="graph"'))]
    nodes = {html.unescape(m) for m in re.findall(r'<circle[^>]*data-node="([^"]*)"', svg)}
    edges = {
        (html.unescape(s), html.unescape(t)): float(w)
        for s, t, w in re.findall(
            r'<line class="edge [a-z]+"[^>]*data-source="([^"]*)" data-target="([^"]*)" '
            r'data-weight="([^"]*)"',
            svg,
        )
    }
    return nodes, edges


def test_traced_graph_is_drawn_with_its_numbers(
    client: TestClient, db: Database, graph: dict[str, Any]
) -> None:
    assert graph["nodes"] and graph["links"], "the traced graph should keep nodes and edges"
    posted = client.post("/api/graphs", json=graph, headers=AUTH)
    assert posted.status_code == 201, posted.text
    graph_id = posted.json()["id"]
    again = client.post("/api/graphs", json=graph, headers=AUTH)
    assert again.status_code == 200 and again.json() == {"id": graph_id, "created": False}

    listing = client.get("/graphs")
    assert listing.status_code == 200
    assert f'href="/graphs/{graph_id}"' in listing.text and "capital" in listing.text

    page = client.get(f"/graphs/{graph_id}")
    assert page.status_code == 200
    text = page.text
    assert html.escape(PROMPT, quote=False) in text
    nodes, edges = _svg_numbers(text)
    # Every node of the graph is drawn, and every edge with the graph's own weight (<= 2,000).
    assert nodes == {n["node_id"] for n in graph["nodes"]}
    assert len(graph["links"]) <= graphs.MAX_DRAWN_LINKS
    assert edges == {(e["source"], e["target"]): e["weight"] for e in graph["links"]}
    # The target logits with their probabilities, and the top features with their influence.
    logits = [n for n in graph["nodes"] if n["feature_type"] == "logit"]
    assert logits
    table = html.unescape(text[text.index('<table class="logits">') :].split("</table>")[0])
    for n in logits:
        row = table[table.index(f"<code>{n['node_id']}</code>") :].split("</tr>")[0]
        assert n["clerp"] in row and f"{n['token_prob']:.4f}" in row
    features = sorted(
        (n for n in graph["nodes"] if n["feature_type"] == "cross layer transcoder"),
        key=lambda n: n["influence"],
    )
    assert features
    table = text[text.index('<table class="features">') :]
    for n in features[:5]:
        row = table[table.index(f"<code>{n['node_id']}</code>") :].split("</tr>")[0]
        assert fmt_num(n["influence"]) in row and fmt_num(n["activation"]) in row

    # A node's details (the htmx fragment, and the same through the page's ?node= deep link):
    # its strongest incoming edge with the graph's weight.
    target = max(logits, key=lambda n: n["token_prob"])["node_id"]
    into = max((e for e in graph["links"] if e["target"] == target), key=lambda e: abs(e["weight"]))
    assert f'hx-get="/fragments/graph-node?graph={graph_id}&amp;node={target}"' in text
    frag = client.get("/fragments/graph-node", params={"graph": graph_id, "node": target})
    assert frag.status_code == 200
    assert (
        f'<code>{into["source"]}</code></a></td><td class="num">{fmt_num(into["weight"])}'
        in frag.text
    )
    deep = client.get(f"/graphs/{graph_id}", params={"node": target}).text
    assert 'class="nodedetail"' in deep and fmt_num(into["weight"]) in deep
    missing = client.get("/fragments/graph-node", params={"graph": graph_id, "node": "nope"})
    assert missing.status_code == 404

    api = client.get(f"/api/graphs/{graph_id}").json()
    assert api["n_nodes"] == len(graph["nodes"]) and api["n_links"] == len(graph["links"])
    assert api["graph"]["links"] == graph["links"]
    with db.read() as s:
        assert len(s.exec(select(GraphRow)).all()) == 1


def test_command_line_stores_a_graph_file(
    graph_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db_file = tmp_path / "cli.sqlite"
    bad = tmp_path / "bad.json"
    bad.write_text(
        '{"metadata": {}, "nodes": [], "links": [{"source": "x", "target": "x", "weight": 1}]}'
    )
    assert dashboard_command(["graph", str(graph_file), str(bad), "--db", str(db_file)]) == 1
    out, err = capsys.readouterr()
    assert "graph 1 (stored)" in out
    assert "bad.json: links[0].source 'x' is not a node of the graph" in err
    assert dashboard_command(["graph", str(graph_file), "--db", str(db_file)]) == 0
    assert "already stored" in capsys.readouterr().out
    db = Database(database_url(db_file))
    with db.read() as s:
        rows = s.exec(select(GraphRow)).all()
    db.dispose()
    assert [(r.slug, r.scan) for r in rows] == [("capital", "ie-synthetic/llama")]


def _tiny() -> dict[str, Any]:
    node = {"node_id": "E_1_0", "layer": "E", "ctx_idx": 0, "feature_type": "embedding"}
    logit = {"node_id": "3_7_0", "layer": "3", "ctx_idx": 0, "feature_type": "logit"}
    return {
        "metadata": {"slug": "t", "prompt_tokens": ["a"], "node_threshold": 0.8},
        "nodes": [node, logit],
        "links": [{"source": "E_1_0", "target": "3_7_0", "weight": 0.5}],
    }


def _set(path: str, value: Any) -> dict[str, Any]:
    g = copy.deepcopy(_tiny())
    *parents, last = path.split(".")
    target: Any = g
    for p in parents:
        target = target[int(p)] if p.isdigit() else target[p]
    if value is _DROP:
        del target[last]
    else:
        target[int(last) if last.isdigit() else last] = value
    return g


_DROP = object()


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"{not json", "not JSON"),
        (b'{"metadata": {}, "nodes": [], "links": [NaN]}', "NaN"),
        (json.dumps([1, 2]).encode(), "a graph is a JSON object"),
        (json.dumps(_set("links", _DROP)).encode(), "the graph has no 'links'"),
        (json.dumps(_set("nodes", {})).encode(), "nodes and links must be arrays"),
        (json.dumps(_set("nodes.0.ctx_idx", "0")).encode(), "nodes[0].ctx_idx must be an integer"),
        (json.dumps(_set("nodes.0.ctx_idx", -1)).encode(), "nodes[0].ctx_idx must be 0 or more"),
        (json.dumps(_set("nodes.1.node_id", 3)).encode(), "nodes[1].node_id must be a string"),
        (json.dumps(_set("nodes.0.layer", "x")).encode(), "nodes[0].layer must be 'E'"),
        (json.dumps(_set("links.0.target", "nope")).encode(), "links[0].target 'nope' is not"),
        (json.dumps(_set("links.0.weight", "1")).encode(), "links[0].weight must be a finite"),
        (json.dumps(_set("metadata.prompt_tokens", [1])).encode(), "prompt_tokens must be"),
    ],
)
def test_malformed_graph_is_400_with_the_reason(
    client: TestClient, db: Database, body: bytes, reason: str
) -> None:
    r = client.post(
        "/api/graphs", content=body, headers={**AUTH, "Content-Type": "application/json"}
    )
    assert r.status_code == 400, r.text
    assert r.json()["detail"].startswith("invalid attribution graph: ")
    assert reason in r.json()["detail"]
    with db.read() as s:
        assert s.exec(select(GraphRow)).all() == []


def test_huge_graph_is_413_and_a_good_one_survives(client: TestClient, db: Database) -> None:
    assert client.post("/api/graphs", json=_tiny(), headers=AUTH).status_code == 201
    g = _tiny()
    g["nodes"] = [
        {"node_id": f"E_{i}_0", "layer": "E", "ctx_idx": 0, "feature_type": "embedding"}
        for i in range(graphs.MAX_NODES + 1)
    ]
    g["links"] = []
    r = client.post("/api/graphs", json=g, headers=AUTH)
    assert r.status_code == 413
    assert f"at most {graphs.MAX_NODES:,} are accepted" in r.json()["detail"]
    assert client.post("/api/graphs", json=_tiny(), headers={}).status_code == 401
    with db.read() as s:
        assert [row.slug for row in s.exec(select(GraphRow))] == ["t"]
    for bad_id in (999, 0, -1, 2**63, 10**30):
        assert client.get(f"/graphs/{bad_id}").status_code == 404
        assert client.get(f"/api/graphs/{bad_id}").status_code == 404
    page = client.get("/graphs/1")
    assert page.status_code == 200 and 'data-weight="0.5"' in page.text
