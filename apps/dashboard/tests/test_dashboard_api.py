"""Ingest and read API against a real SQLite file: validation, idempotency, tokens, transactions."""

from __future__ import annotations

import pytest
from dashboard_fixtures import AUTH, TOKEN, make_cell, make_result
from fastapi.testclient import TestClient
from ie_dashboard.app import create_app
from ie_dashboard.db import Database
from ie_dashboard.tables import BenchmarkCellRow, ValidatorPointRow, ValidatorRunRow, WorkloadRow
from sqlmodel import func, select


def _count(db: Database, table: type) -> int:
    with db.read() as s:
        return s.exec(select(func.count()).select_from(table)).one()


def test_benchmark_cell_ingest_is_idempotent(client: TestClient, db: Database) -> None:
    cell = make_cell(variant="vllm", decode=30.0, aggregate=150.0)
    first = client.post("/api/benchmarks", json=cell, headers=AUTH)
    assert first.status_code == 201, first.text
    assert first.json()["created"] is True
    again = client.post("/api/benchmarks", json=cell, headers=AUTH)
    assert again.status_code == 200
    assert again.json() == {"id": first.json()["id"], "created": False}
    assert _count(db, BenchmarkCellRow) == 1
    assert _count(db, WorkloadRow) == 3  # children replaced, not appended
    # A later run of the same cell is a new row; the page shows the latest.
    later = make_cell(
        variant="vllm", decode=33.0, aggregate=160.0, started="2026-11-29T09:00:00+00:00"
    )
    assert client.post("/api/benchmarks", json=later, headers=AUTH).status_code == 201
    assert _count(db, BenchmarkCellRow) == 2
    cells = client.get("/api/benchmarks", params={"variant": "vllm"}).json()
    assert [c["workloads"][0]["metrics"]["decode_tok_s"] for c in cells] == [30.0, 33.0]


def test_validator_ingest_is_idempotent(client: TestClient, db: Database) -> None:
    result = make_result()
    assert client.post("/api/validator", json=result, headers=AUTH).status_code == 201
    assert client.post("/api/validator", json=result, headers=AUTH).status_code == 200
    assert _count(db, ValidatorRunRow) == 1
    assert _count(db, ValidatorPointRow) == len(result["points"])
    runs = client.get("/api/validator", params={"points": True}).json()
    assert len(runs) == 1 and runs[0]["family"] == "llama"
    assert {p["address"] for p in runs[0]["points"]} == {p["address"] for p in result["points"]}


@pytest.mark.parametrize(
    ("mutate", "loc"),
    [
        (lambda c: c["model"].pop("model_id"), ["body", "model", "model_id"]),
        (lambda c: c["workloads"]["generate"].update(status="fast"), ["body", "workloads", "generate", "status"]),
        (lambda c: c.update(schema="ie-bench/cell/0"), ["body", "schema"]),
        (lambda c: c.update(started_at="yesterday"), ["body", "started_at"]),
        (lambda c: c["workloads"]["generate"]["metrics"].update(decode_tok_s="quick"),
         ["body", "workloads", "generate", "metrics", "decode_tok_s"]),
    ],
)  # fmt: skip
def test_bad_cell_is_422_naming_the_field(client: TestClient, db: Database, mutate, loc) -> None:
    cell = make_cell()
    mutate(cell)
    r = client.post("/api/benchmarks", json=cell, headers=AUTH)
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == loc
    assert ".".join(loc[1:]) in r.json()["error"]
    assert _count(db, BenchmarkCellRow) == 0


def test_bad_validator_result_is_422(client: TestClient) -> None:
    result = make_result()
    result["points"][1]["layer"] = -1
    r = client.post("/api/validator", json=result, headers=AUTH)
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "points", 1, "layer"]
    dup = make_result()
    dup["points"].append(dict(dup["points"][1]))
    r = client.post("/api/validator", json=dup, headers=AUTH)
    assert r.status_code == 422 and "listed twice" in r.json()["error"]


@pytest.mark.parametrize("body", [b"{not json", b"", b"\xff\xfe"])
def test_malformed_json_is_422(client: TestClient, body: bytes) -> None:
    r = client.post(
        "/api/benchmarks", content=body, headers={**AUTH, "Content-Type": "application/json"}
    )
    assert r.status_code == 422
    assert r.json()["detail"][0]["type"] == "json_invalid"


def test_write_token_is_required(client: TestClient, db: Database) -> None:
    cell = make_cell()
    missing = client.post("/api/benchmarks", json=cell)
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == "Bearer"
    assert (
        client.post(
            "/api/benchmarks", json=cell, headers={"Authorization": f"Basic {TOKEN}"}
        ).status_code
        == 401
    )
    assert (
        client.post("/api/benchmarks", json=cell, headers={"Authorization": "Bearer"}).status_code
        == 401
    )
    wrong = client.post(
        "/api/validator", json=make_result(), headers={"Authorization": "Bearer nope"}
    )
    assert wrong.status_code == 403
    # The token is checked before the body: no parse errors leak to an unauthenticated caller.
    assert (
        client.post(
            "/api/benchmarks", content=b"{bad", headers={"Content-Type": "application/json"}
        ).status_code
        == 401
    )
    assert _count(db, BenchmarkCellRow) == 0 and _count(db, ValidatorRunRow) == 0


def test_writes_are_refused_when_the_server_has_no_token(db: Database) -> None:
    with TestClient(create_app(db, token=None)) as c:
        r = c.post("/api/benchmarks", json=make_cell(), headers=AUTH)
    assert r.status_code == 403
    assert "IE_DASHBOARD_TOKEN" in r.json()["detail"]


def test_token_comes_from_the_environment(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IE_DASHBOARD_TOKEN", "from-env")
    with TestClient(create_app(db)) as c:
        assert (
            c.post(
                "/api/benchmarks", json=make_cell(), headers={"Authorization": "Bearer from-env"}
            ).status_code
            == 201
        )
        assert c.post("/api/benchmarks", json=make_cell(), headers=AUTH).status_code == 403


def test_a_failed_write_leaves_nothing(db: Database) -> None:
    """One transaction: a cell whose children fail to insert leaves no half-written cell."""
    db.migrate()
    with pytest.raises(RuntimeError), db.write() as s:
        s.add(BenchmarkCellRow(cell_key="k", model="m", variant="eager", started="t"))
        s.flush()
        raise RuntimeError("disk full, say")
    assert _count(db, BenchmarkCellRow) == 0


def test_database_url_env_selects_the_database(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "from-env.sqlite"
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{target}")
    with TestClient(create_app(token=TOKEN)) as c:
        assert c.post("/api/benchmarks", json=make_cell(), headers=AUTH).status_code == 201
    assert target.exists()
    other = Database(f"sqlite:///{target}")
    assert _count(other, BenchmarkCellRow) == 1
    other.dispose()


def test_oversized_body_is_413(client: TestClient) -> None:
    from ie_dashboard.app import MAX_BODY

    r = client.post("/api/benchmarks", content=b" " * (MAX_BODY + 1), headers=AUTH)
    assert r.status_code == 413


def test_a_lost_insert_race_is_retried_once(db: Database) -> None:
    """On a server database two writers can insert one key at once; the loser retries as an update."""
    from ie_dashboard.app import _store
    from sqlalchemy.exc import IntegrityError

    db.migrate()
    calls: list[int] = []

    def racing_upsert(session, item, source):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 1:
            raise IntegrityError("INSERT", {}, Exception("UNIQUE constraint failed"))
        return 7, False

    assert _store(db, racing_upsert, object()) == (7, False)  # type: ignore[arg-type]
    assert len(calls) == 2
    calls.clear()

    def always_fails(session, item, source):  # type: ignore[no-untyped-def]
        calls.append(1)
        raise IntegrityError("INSERT", {}, Exception("UNIQUE constraint failed"))

    with pytest.raises(IntegrityError):
        _store(db, always_fails, object())  # type: ignore[arg-type]
    assert len(calls) == 2
