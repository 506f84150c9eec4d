"""An installed dashboard with no results says so and how to load them; the footer names where
the figures on the page came from and never claims results the database does not hold."""

from __future__ import annotations

from pathlib import Path

from dashboard_fixtures import AUTH, make_cell, make_result, write_json
from fastapi.testclient import TestClient
from ie_dashboard.db import Database
from ie_dashboard.seed import seed


def test_empty_pages_say_how_to_load_results(client: TestClient) -> None:
    for page, what in (
        ("/throughput", "No benchmark cells loaded"),
        ("/validation", "No validator results loaded"),
    ):
        html = client.get(page).text
        assert what in html
        assert "ie dashboard seed --root PATH" in html
        assert "committed" not in html  # the old footer claimed results that were not there
        assert "no " in html.split("<footer>")[1]


def test_footer_counts_results_by_source(client: TestClient, db: Database, tmp_path: Path) -> None:
    write_json(tmp_path / "benchmarks" / "cells" / "a.json", make_cell())
    write_json(tmp_path / "validator" / "results" / "m" / "eager.json", make_result())
    report = seed(db, tmp_path)
    assert not report.errors, report.errors
    assert (
        client.post("/api/benchmarks", json=make_cell(variant="vllm"), headers=AUTH).status_code
        == 201
    )
    footer = client.get("/throughput").text.split("<footer>")[1]
    assert "2 benchmark cells: 1 POSTed to the API, 1 from benchmarks/cells/" in footer
    footer = client.get("/validation").text.split("<footer>")[1]
    assert "1 validator results: 1 from validator/results/m/" in footer


def test_seed_without_a_root_names_the_load_command(db: Database) -> None:
    report = seed(db, None)
    assert any("ie dashboard seed --root PATH" in line for line in report.skipped)


def test_footer_counts_the_registry_points(client: TestClient) -> None:
    """The footer's point count is the registry's (it said 34, hard-coded, beside "23 of 38")."""
    from ie_core.grammar import POINTS

    footer = client.get("/validation").text.split("<footer>")[1]
    assert f"{len(POINTS)} standardized points from ie-core's registry" in footer
    assert len(POINTS) != 34  # the old hard-coded number, so this test can fail
