"""The dashboard on a PostgreSQL server the session starts (conftest's `pg_server`).

- `ie dashboard --workers 4` on one database, 500 results posted from 4 client processes at once
  (plus each process re-posting part of another's share, so one key races from two processes):
  every result stored once, each with all its points, exactly 500 answers "created".
- The server stopped (`-m immediate`, as a crash) and started again mid-ingest: answers are 201,
  200 or 503 (never a 500), every retried result lands once, and no run is stored half-written.
The SQLite side of the same guarantees: test_dashboard_concurrency.py.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from dashboard_fixtures import AUTH, TOKEN, make_result
from fastapi.testclient import TestClient
from ie_core.grammar import FAMILIES
from ie_dashboard.app import create_app
from ie_dashboard.db import Database, DatabaseError
from ie_dashboard.migrations import MIGRATIONS
from ie_dashboard.serve import free_port
from ie_dashboard.tables import ValidatorPointRow, ValidatorRunRow
from ingest_load import post_share
from postgres_server import PostgresServer
from sqlmodel import func, select

N = 500
PROCESSES = WORKERS = 4
SHARED = 30  # of each process's share, also posted by the next process
STARTUP_S = 180  # a deadline for the workers to answer, not a measured figure


def _results(n: int, layers: tuple[int, ...]) -> list[dict[str, Any]]:
    return [
        make_result(hf_id=f"ie-synthetic/m{i % 25}", engine=f"engine{i // 25}", layers=layers)
        for i in range(n)
    ]


def _problems(db: Database, results: list[dict[str, Any]]) -> list[str]:
    """What is missing, extra or half-written in `db` against the posted `results`."""
    want = {(r["hf_id"], r["engine"]): len(r["points"]) for r in results}
    with db.read() as s:
        rows = s.exec(
            select(ValidatorRunRow.hf_id, ValidatorRunRow.engine, func.count(ValidatorPointRow.id))
            .join(ValidatorPointRow, isouter=True)
            .group_by(ValidatorRunRow.id)
        ).all()
        orphans = s.exec(
            select(func.count()).where(
                ~ValidatorPointRow.run_id.in_(select(ValidatorRunRow.id))  # type: ignore[attr-defined]
            )
        ).one()
    have: dict[tuple[str, str], int] = {}
    problems = [f"{orphans} points without a run"] if orphans else []
    for hf_id, engine, points in rows:
        if (hf_id, engine) in have:
            problems.append(f"{hf_id} {engine} stored twice")
        have[(hf_id, engine)] = points
    problems += [f"{k} lost" for k in want.keys() - have.keys()]
    problems += [f"{k} not posted" for k in have.keys() - want.keys()]
    problems += [
        f"{k}: {have[k]} of {n} points" for k, n in want.items() if k in have and have[k] != n
    ]
    return problems


@pytest.fixture
def workers(pg_server: PostgresServer, tmp_path: Path) -> Iterator[tuple[str, str, int]]:
    """`ie dashboard --workers 4` on a fresh database; yields (base URL, database URL, its pid)."""
    url, port = pg_server.create_database(), free_port()
    ie = str(Path(sys.executable).parent / "ie")
    argv = [ie, "dashboard", "serve", "--db", url, "--workers", str(WORKERS), "--port", str(port)]
    argv += ["--root", str(tmp_path)]  # an empty folder: nothing to seed but the registry
    log = (tmp_path / "server.log").open("w")
    env = {**os.environ, "IE_DASHBOARD_TOKEN": TOKEN}
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=log, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(base, proc, tmp_path / "server.log")
        yield base, url, proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the uvicorn supervisor and its workers
        proc.wait(timeout=60)
        log.close()


def _wait_ready(base: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"ie dashboard --workers exited {proc.returncode}: {log.read_text()}")
        try:
            if httpx.get(f"{base}/api/validator", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    pytest.fail(f"ie dashboard --workers did not answer in {STARTUP_S}s: {log.read_text()}")


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(x) for x in text.split()]


def test_500_ingests_from_4_processes_through_4_workers(workers: tuple[str, str, int]) -> None:
    base, url, supervisor = workers
    assert len(_children(supervisor)) >= WORKERS  # separate server processes, not threads
    results = _results(N, layers=(0,))
    share = N // PROCESSES
    shares = [results[p * share : (p + 1) * share] for p in range(PROCESSES)]
    # Each process posts its own share and the start of the next one's: those keys race.
    jobs = [shares[p] + shares[(p + 1) % PROCESSES][:SHARED] for p in range(PROCESSES)]
    spawn = multiprocessing.get_context("spawn")  # no fork of a threaded pytest process
    with ProcessPoolExecutor(PROCESSES, mp_context=spawn) as pool:
        codes = [c for out in pool.map(post_share, [base] * 4, [TOKEN] * 4, jobs) for c in out]
    assert set(codes) <= {200, 201}, sorted(set(codes))
    assert codes.count(201) == N  # each key created exactly once, however the race fell
    assert len(codes) == N + PROCESSES * SHARED
    db = Database(url)
    try:
        assert _problems(db, results) == []
        # Negative control: the same check sees a half-written run and a lost result.
        with db.write() as s:
            s.delete(s.exec(select(ValidatorPointRow)).first())
        extra = make_result(hf_id="ie-synthetic/never-posted", layers=(0,))
        found = _problems(db, [*results, extra])
        points = len(results[0]["points"])
        assert len(found) == 2 and "lost" in found[0], found
        assert found[1].endswith(f": {points - 1} of {points} points"), found
    finally:
        db.dispose()


def test_a_server_restart_mid_ingest_leaves_nothing_half_written(
    pg_server: PostgresServer,
) -> None:
    n, threads = 200, 8
    results = _results(n, layers=(0, 1, 3))
    db = Database(pg_server.create_database())
    done = threading.Semaphore(0)
    codes: dict[int, int] = {}
    with TestClient(create_app(db, token=TOKEN)) as client:

        def post(i: int) -> None:
            try:
                codes[i] = client.post("/api/validator", json=results[i], headers=AUTH).status_code
            finally:
                done.release()  # an exception still counts, and f.result() re-raises it

        with ThreadPoolExecutor(threads) as pool:
            futures = [pool.submit(post, i) for i in range(n)]
            for _ in range(n // 3):
                done.acquire()
            pg_server.stop("immediate")  # posts in flight lose their connection mid-transaction
            down = client.post("/api/validator", json=results[-1], headers=AUTH)
            pg_server.start()
            for f in futures:
                f.result()
        assert down.status_code == 503 and "retry" in down.json()["detail"], down.text
        assert down.headers["Retry-After"]
        assert set(codes.values()) <= {200, 201, 503}, sorted(set(codes.values()))
        for _round in range(3):  # the client's part: retry what was answered 503
            for i in [i for i, c in codes.items() if c == 503]:
                codes[i] = client.post("/api/validator", json=results[i], headers=AUTH).status_code
        assert set(codes.values()) <= {200, 201}
    try:
        assert _problems(db, results) == []
    finally:
        db.dispose()


def test_workers_starting_together_migrate_and_seed_once(pg_server: PostgresServer) -> None:
    """Four apps built at once on one fresh database (as `--workers 4` does): no error, each
    migration step recorded once, the registry whole (not doubled, not half-deleted)."""
    url = pg_server.create_database()
    dbs = [Database(url) for _ in range(4)]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda d: create_app(d, token=TOKEN), dbs))
    with dbs[0].engine.connect() as conn:
        versions = conn.execute(sa.text("SELECT version FROM schema_migrations")).scalars().all()
        archs = conn.execute(sa.text("SELECT count(*) FROM architectures")).scalar_one()
    assert sorted(versions) == [m.version for m in MIGRATIONS]
    assert archs == len(FAMILIES)
    for d in dbs:
        d.dispose()


def test_an_unreachable_server_is_one_line_without_the_password() -> None:
    port = free_port()  # nothing listens there
    db = Database(f"postgresql://team:s3cret@127.0.0.1:{port}/dashboard")
    with pytest.raises(DatabaseError) as caught:
        db.check()
    message = str(caught.value)
    assert "s3cret" not in message and "team:***@127.0.0.1" in message, message
    assert "server is up" in message and "\n" not in message
    assert "s3cret" not in db.label
    db.dispose()


def test_missing_server_binaries_skip_locally_and_fail_under_ci(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import postgres_server

    monkeypatch.setattr(postgres_server, "find_bindir", lambda: None)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install -y postgresql"):
        postgres_server.start_server()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="not found"):
        postgres_server.start_server()
