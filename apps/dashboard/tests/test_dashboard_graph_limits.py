"""A graph refused for its size names what makes it smaller (issue 68, item 2): `ie trace`'s
--node-threshold / --edge-threshold, on the command line (`ie dashboard graph`) and the API; and
the limits the refusals use are the ones `ie trace` checks (ie_core.graph_limits)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dashboard_fixtures import AUTH
from fastapi.testclient import TestClient
from ie_core import graph_limits
from ie_dashboard import body, graphs
from ie_dashboard.cli import dashboard_command
from ie_dashboard.db import Database

FLAGS = ("--node-threshold", "--edge-threshold")


def _graph(n_links: int, pad: int = 0) -> dict:
    nodes = [{"node_id": "E_1_0", "layer": "E", "ctx_idx": 0, "feature_type": "embedding"},
             {"node_id": "3_7_0", "layer": "3", "ctx_idx": 0, "feature_type": "logit",
              "clerp": "x" * pad}]  # fmt: skip
    link = {"source": "E_1_0", "target": "3_7_0", "weight": 0.5}
    return {"metadata": {"slug": "big", "prompt_tokens": ["a"]}, "nodes": nodes,
            "links": [link] * n_links}  # fmt: skip


def test_the_page_limits_are_ie_cores() -> None:
    assert graphs.MAX_NODES == graph_limits.MAX_GRAPH_NODES
    assert graphs.MAX_LINKS == graph_limits.MAX_GRAPH_LINKS
    assert body.MAX_BODY == graph_limits.MAX_GRAPH_BYTES


def test_ie_dashboard_graph_names_the_thresholds(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    big = tmp_path / "big.json"
    big.write_text(json.dumps(_graph(1, pad=body.MAX_BODY)))
    assert dashboard_command(["graph", str(big), "--db", str(tmp_path / "d.sqlite")]) == 1
    said = capsys.readouterr().err
    assert f"the limit is {body.MAX_BODY:,}" in said and all(f in said for f in FLAGS), said


def test_the_api_names_the_thresholds(client: TestClient, db: Database) -> None:
    r = client.post("/api/graphs", json=_graph(graphs.MAX_LINKS + 1), headers=AUTH)
    assert r.status_code == 413
    assert all(f in r.json()["detail"] for f in FLAGS), r.json()
