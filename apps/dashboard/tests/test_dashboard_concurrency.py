"""1,000 results posted from many threads, through two app instances on one SQLite file, lose none."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dashboard_fixtures import AUTH, TOKEN, make_result
from fastapi.testclient import TestClient
from ie_dashboard.app import create_app
from ie_dashboard.config import database_url
from ie_dashboard.db import Database
from ie_dashboard.tables import ValidatorPointRow, ValidatorRunRow
from sqlmodel import func, select

N = 1000
THREADS = 8


def test_concurrent_ingest_loses_nothing(tmp_path: Path) -> None:
    url = database_url(tmp_path / "concurrent.sqlite")
    # Two Database objects have separate in-process locks, so they contend in SQLite itself, as two
    # server processes would: BEGIN IMMEDIATE plus busy_timeout must queue them, not fail them.
    db_a, db_b = Database(url), Database(url)
    results = [
        make_result(hf_id=f"ie-synthetic/m{i % 50}", engine=f"engine{i // 50}", layers=(0,))
        for i in range(N)
    ]
    with (
        TestClient(create_app(db_a, token=TOKEN)) as a,
        TestClient(create_app(db_b, token=TOKEN)) as b,
    ):

        def post(i: int) -> int:
            client = a if i % 2 else b
            return client.post("/api/validator", json=results[i], headers=AUTH).status_code

        with ThreadPoolExecutor(THREADS) as pool:
            codes = list(pool.map(post, range(N)))
        # Re-posting a slice concurrently must not add rows either.
        with ThreadPoolExecutor(THREADS) as pool:
            again = list(pool.map(post, range(100)))
    assert codes == [201] * N
    assert again == [200] * 100
    check = Database(url)
    with check.read() as s:
        assert s.exec(select(func.count()).select_from(ValidatorRunRow)).one() == N
        assert s.exec(select(func.count()).select_from(ValidatorPointRow)).one() == N * len(
            results[0]["points"]
        )
        keys = set(s.exec(select(ValidatorRunRow.hf_id, ValidatorRunRow.engine)).all())
    assert keys == {(r["hf_id"], r["engine"]) for r in results}
    for db in (db_a, db_b, check):
        db.dispose()
