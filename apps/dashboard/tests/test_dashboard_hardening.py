"""Regression tests for issue #13's dashboard findings: each failed (500, a wrong page, a lost
row) on the code before the fix."""

from __future__ import annotations

import json
import re

import pytest
import sqlalchemy as sa
from dashboard_fixtures import AUTH, make_cell, make_result
from fastapi.testclient import TestClient
from ie_dashboard.db import Database
from ie_dashboard.tables import BenchmarkCellRow, ValidatorRunRow
from sqlmodel import func, select

JSON = {**AUTH, "Content-Type": "application/json"}


def _count(db: Database, table: type) -> int:
    with db.read() as s:
        return s.exec(select(func.count()).select_from(table)).one()


def _raw(data: object) -> str:
    """JSON as Python writes it: NaN and Infinity come out as bare tokens."""
    return json.dumps(data, allow_nan=True)


# ---------------------------------------------------------------- non-finite and negative numbers


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_metric_is_refused_and_throughput_keeps_rendering(
    client: TestClient, db: Database, value: float
) -> None:
    r = client.post("/api/benchmarks", content=_raw(make_cell(decode=value)), headers=JSON)
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == "json_not_finite"
    assert "not a number JSON allows" in r.json()["error"]
    assert _count(db, BenchmarkCellRow) == 0
    assert client.get("/throughput").status_code == 200


def test_overflowing_float_literal_is_refused(client: TestClient, db: Database) -> None:
    text = _raw(make_cell()).replace('"decode_tok_s": 20.0', '"decode_tok_s": 1e999', 1)
    assert "1e999" in text
    r = client.post("/api/benchmarks", content=text, headers=JSON)
    assert r.status_code == 422 and "overflows" in r.json()["error"]
    assert _count(db, BenchmarkCellRow) == 0


def test_negative_metric_is_refused(client: TestClient, db: Database) -> None:
    r = client.post("/api/benchmarks", json=make_cell(decode=-5.0), headers=AUTH)
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == [
        "body", "workloads", "generate", "metrics", "decode_tok_s"
    ]  # fmt: skip
    assert _count(db, BenchmarkCellRow) == 0


def test_a_stored_bad_metric_shows_as_invalid_never_as_a_bar(
    client: TestClient, db: Database
) -> None:
    """Rows stored before the check (NaN / negative in metrics_json) render as 'invalid'."""
    for variant in ("eager", "vllm"):
        assert (
            client.post(
                "/api/benchmarks", json=make_cell(variant=variant), headers=AUTH
            ).status_code
            == 201
        )
    with db.engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE benchmark_workloads SET metrics_json = '{\"decode_tok_s\": NaN}' WHERE workload = 'generate'"
            )
        )
        conn.execute(sa.text("UPDATE benchmark_workloads SET metrics_json = '{\"aggregate_tok_s\": -4.0}' WHERE workload = 'generate_x8'"))  # fmt: skip
    r = client.get("/throughput")
    assert r.status_code == 200
    widths = [float(w) for w in re.findall(r'class="bar [a-z]+"[^>]*width="([^"]+)"', r.text)]
    assert widths and all(w == 0 for w in widths)
    assert "invalid" in r.text
    figures = client.get("/api/throughput").json()[0]["figures"]
    assert {f["one_status"] for f in figures} == {"invalid"}


# ---------------------------------------------------------------- NaN never under a pass


def test_nan_cosine_is_refused(client: TestClient, db: Database) -> None:
    result = make_result()
    result["points"][1]["cos"] = float("nan")
    r = client.post("/api/validator", content=_raw(result), headers=JSON)
    assert r.status_code == 422
    assert _count(db, ValidatorRunRow) == 0


@pytest.mark.parametrize(
    ("field", "value"), [("cos", None), ("cos", 1.5), ("max_abs_diff", -1.0), ("rel_diff", None)]
)
def test_a_pass_point_must_carry_sane_numbers(
    client: TestClient, db: Database, field, value
) -> None:
    result = make_result()
    result["points"][1][field] = value
    r = client.post("/api/validator", json=result, headers=AUTH)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"][:3] == ["body", "points", 1]
    assert _count(db, ValidatorRunRow) == 0


def test_a_stored_pass_without_a_cosine_shows_as_error(client: TestClient, db: Database) -> None:
    """SQLite stores NaN as NULL: an old row holds `pass` with no cosine. It must not read as pass."""
    assert client.post("/api/validator", json=make_result(), headers=AUTH).status_code == 201
    with db.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE validator_points SET cos = NULL WHERE address = 'resid_post.1'")
        )
    matrix = client.get("/validation").text
    assert '<td class="g error">' in matrix and '<td class="g pass">' not in matrix
    run = client.get(
        "/fragments/run", params={"model": "ie-synthetic/llama", "engine": "nnsight"}
    ).text
    assert 'class="g pass">✓ pass</span></h2>' not in run
    assert "✗ error</span></h2>" in run
    assert "stored as pass without a finite cos" in run


# ---------------------------------------------------------------- query parameters


@pytest.mark.parametrize("point", ["resid_post.²", "resid_post.٣", "résid_post.1", "resid_post.01"])
def test_a_point_with_non_ascii_or_odd_digits_is_404_not_500(
    client: TestClient, point: str
) -> None:
    for path, params in (
        ("/", {"point": point}),
        ("/fragments/card", {"arch": "llama", "point": point}),
    ):
        r = client.get(path, params=params)
        assert r.status_code == 404, (path, point)
        assert "bad point" in r.text


def test_an_out_of_range_layer_is_no_such_point(client: TestClient) -> None:
    for point in ("resid_post.99999999999999999999999", "resid_post.256"):
        r = client.get("/", params={"arch": "llama", "point": point})
        assert r.status_code == 404 and "no such point" in r.text
        assert "data-point=" not in r.text  # no card drawn
    assert client.get("/", params={"arch": "llama", "point": "resid_post.255"}).status_code == 200


# ---------------------------------------------------------------- bodies that broke the parser


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        ("[" * 2000 + "]" * 2000, "json_too_deep"),
        ('{"a":' * 65 + "1" + "}" * 65, "json_too_deep"),
        ("1" * 5001, "json_int_too_long"),
        ('{"hf_id": "x", "engine": "y", "extra": "\\ud800"}', "json_invalid"),
    ],
)
def test_bodies_that_broke_the_parser_are_422(
    client: TestClient, db: Database, body: str, kind: str
) -> None:
    for path in ("/api/validator", "/api/benchmarks"):
        r = client.post(path, content=body, headers=JSON)
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["type"] == kind and r.json()["error"]
    assert _count(db, ValidatorRunRow) == 0 and _count(db, BenchmarkCellRow) == 0


def test_lone_surrogate_inside_a_valid_result_is_refused(client: TestClient, db: Database) -> None:
    result = make_result()
    result["versions"] = {"torch": "\ud800"}
    r = client.post("/api/validator", content=json.dumps(result), headers=JSON)
    assert r.status_code == 422 and "surrogate" in r.json()["error"]
    assert _count(db, ValidatorRunRow) == 0


def test_depth_counts_brackets_inside_strings_as_text(client: TestClient) -> None:
    result = make_result()
    result["error"] = "[" * 500  # deep-looking, but a string
    assert client.post("/api/validator", json=result, headers=AUTH).status_code == 201


def test_declared_oversize_body_is_refused_before_it_is_read(client: TestClient) -> None:
    from ie_dashboard.body import MAX_BODY

    r = client.post(
        "/api/benchmarks", content=b"{}", headers={**JSON, "Content-Length": str(MAX_BODY + 1)}
    )
    assert r.status_code == 413 and "limit" in r.json()["error"]


def test_a_time_that_overflows_utc_is_422(client: TestClient, db: Database) -> None:
    cell = make_cell(started="9999-12-31T23:59:59-05:00")
    r = client.post("/api/benchmarks", json=cell, headers=AUTH)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "started_at"]
    assert _count(db, BenchmarkCellRow) == 0


def test_a_layer_past_sqlite_integers_is_422(client: TestClient, db: Database) -> None:
    result = make_result()
    result["points"][1]["layer"] = 2**63
    r = client.post("/api/validator", json=result, headers=AUTH)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "points", 1, "layer"]
    assert _count(db, ValidatorRunRow) == 0


# ---------------------------------------------------------------- NUL (PostgreSQL text cannot hold it)


def test_a_nul_in_a_lookup_is_400_not_500(client: TestClient) -> None:
    for path in (
        "/validation/run?model=ie-synthetic%2Fllama%00&engine=nnsight",
        "/api/validator?model=a%00b",
        "/fragments/card?arch=llama%00&point=resid_post.0",
    ):
        r = client.get(path)
        assert r.status_code == 400 and "NUL" in r.json()["detail"], path


def test_a_nul_in_a_posted_string_is_422_and_stores_nothing(
    client: TestClient, db: Database
) -> None:
    result = make_result(hf_id="ie-synthetic/ll\u0000ama")
    r = client.post("/api/validator", json=result, headers=AUTH)
    assert r.status_code == 422 and "U+0000" in r.json()["error"], r.text
    cell = make_cell()
    cell["environment"]["cpu\u0000"] = "x"  # a key, deep in free-form JSON
    assert client.post("/api/benchmarks", json=cell, headers=AUTH).status_code == 422
    assert _count(db, ValidatorRunRow) == 0 and _count(db, BenchmarkCellRow) == 0
    # Control: without the NUL the same bodies are stored.
    assert client.post("/api/validator", json=make_result(), headers=AUTH).status_code == 201
