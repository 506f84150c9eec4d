"""Regression tests for issue #13's storage findings: colliding natural keys and export names, a
read-only database that could not serve, a corrupt one that gave a traceback."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import sqlalchemy as sa
from dashboard_fixtures import AUTH, TOKEN, make_cell, make_result
from fastapi.testclient import TestClient
from ie_dashboard.app import create_app
from ie_dashboard.cli import dashboard_command
from ie_dashboard.config import database_url
from ie_dashboard.db import Database, DatabaseError
from ie_dashboard.export import export_site
from ie_dashboard.migrations import applied_versions, migrate
from ie_dashboard.tables import BenchmarkCellRow, ValidatorRunRow
from sqlmodel import func, select


def _count(db: Database, table: type) -> int:
    with db.read() as s:
        return s.exec(select(func.count()).select_from(table)).one()


# ---------------------------------------------------------------- natural keys


def test_fields_holding_the_old_separator_do_not_collide(client: TestClient, db: Database) -> None:
    """`team|x` + `vllm` and `team` + `x|vllm` joined to one `|` key; now they are two rows."""
    first = make_cell(model_id="team|x", variant="vllm", decode=11.0)
    second = make_cell(model_id="team", variant="x|vllm", decode=22.0)
    assert client.post("/api/benchmarks", json=first, headers=AUTH).status_code == 201
    assert client.post("/api/benchmarks", json=second, headers=AUTH).status_code == 201
    assert _count(db, BenchmarkCellRow) == 2
    cells = {c["model"]: c for c in client.get("/api/benchmarks").json()}
    assert cells["team|x"]["workloads"][0]["metrics"]["decode_tok_s"] == 11.0
    assert cells["team"]["variant"] == "x|vllm"
    a = make_result(hf_id="m|e", engine="nnsight")
    b = make_result(hf_id="m", engine="e|nnsight")
    assert client.post("/api/validator", json=a, headers=AUTH).status_code == 201
    assert client.post("/api/validator", json=b, headers=AUTH).status_code == 201
    assert _count(db, ValidatorRunRow) == 2


def _old_key_row(conn: sa.Connection, key: str, model: str, variant: str, raw: dict) -> None:
    conn.execute(
        sa.text(
            "INSERT INTO benchmark_cells (cell_key, model, variant, started, finished, command, device,"
            " env_label, env_json, raw_json, source, ingested_at, cell_id, profile, status) VALUES"
            " (:k, :m, :v, '2026-11-29T08:00:00+00:00', NULL, '', 'cpu', 'old', '{}', :raw, 'test', '',"
            " '', :p, 'ok')"
        ),
        {"k": key, "m": model, "v": variant, "raw": json.dumps(raw), "p": raw["profile"]["name"]},
    )


def test_migration_6_rekeys_rows_stored_with_the_old_join(tmp_path: Path) -> None:
    url = database_url(tmp_path / "v5.sqlite")
    old = Database(url)
    migrate(old.engine, target=5)
    cell = make_cell(model_id="org/m", variant="vllm")
    with old.engine.begin() as conn:
        _old_key_row(conn, "org/m|vllm|cpu|2026-11-29T08:00:00+00:00", "org/m", "vllm", cell)
        conn.execute(
            sa.text(
                "INSERT INTO validator_runs (run_key, hf_id, engine, reference, verdict, captured_at,"
                " status, dtype, device, versions_json, raw_json, source, ingested_at, family, error)"
                " VALUES ('x|nnsight|2026-11-29T08:00:00+00:00', 'x', 'nnsight', 'eager', 'pass',"
                " '2026-11-29T08:00:00+00:00', '', '', '', '{}', '{}', '', '', '', '')"
            )
        )
    old.dispose()
    with TestClient(create_app(url, token=TOKEN)) as c:  # start-up migrates
        assert c.get("/healthz").json()["schema_versions"] == [1, 2, 3, 4, 5, 6, 7, 8, 9]
        # The same cell and result again update the migrated rows instead of adding new ones.
        assert c.post("/api/benchmarks", json=cell, headers=AUTH).status_code == 200
        again = make_result(hf_id="x", engine="nnsight", captured_at="2026-11-29T08:00:00+00:00")
        assert c.post("/api/validator", json=again, headers=AUTH).status_code == 200
    db = Database(url)
    with db.read() as s:
        keys = [r.cell_key for r in s.exec(select(BenchmarkCellRow))]
    assert keys == ['["org/m","vllm","cpu","2026-11-29T08:00:00+00:00"]']
    assert _count(db, ValidatorRunRow) == 1
    db.dispose()


def test_migration_6_keeps_old_rows_that_meet_on_one_key_apart(tmp_path: Path) -> None:
    """Two cells from before step 4 whose profile is unrecoverable would share a key: both stay."""
    url = database_url(tmp_path / "v3.sqlite")
    old = Database(url)
    migrate(old.engine, target=3)
    with old.engine.begin() as conn:
        for key in ("m|v|cpu|t", "m|v|gpu|t"):
            conn.execute(
                sa.text(
                    "INSERT INTO benchmark_cells (cell_key, model, variant, started, finished, command,"
                    " device, env_label, env_json, raw_json, source, ingested_at) VALUES (:k, 'm', 'v',"
                    " 't', NULL, '', 'cpu', '', '{}', '{}', 'test', '')"
                ),
                {"k": key},
            )
    assert migrate(old.engine) == [4, 5, 6, 7, 8, 9]
    with old.read() as s:
        keys = sorted(r.cell_key for r in s.exec(select(BenchmarkCellRow)))
    assert keys == ['["m","v","","t (row 2)"]', '["m","v","","t"]']
    old.dispose()


# ---------------------------------------------------------------- export file names


def test_export_keeps_ids_that_fold_to_one_name_apart(tmp_path: Path) -> None:
    db = Database(database_url(tmp_path / "e.sqlite"))
    ids = ("Collide/Model", "collide/model", "collide--model")
    with TestClient(create_app(db, token=TOKEN)) as c:
        for hf_id in ids:
            r = c.post("/api/validator", json=make_result(hf_id=hf_id), headers=AUTH)
            assert r.status_code == 201
    out = tmp_path / "site"
    export_site(db, out)
    pages = sorted((out / "validation").glob("*__*.html"))
    assert len(pages) == 3
    assert len({p.name.casefold() for p in pages}) == 3  # apart on case-insensitive disks too
    shown = {p.read_text().split("<code>", 1)[1].split("</code>", 1)[0] for p in pages}
    assert shown == set(ids)  # each file holds its own model
    matrix = (out / "validation/index.html").read_text()
    for p in pages:
        assert f'href="{p.name}"' in matrix
    db.dispose()


# ---------------------------------------------------------------- read-only and corrupt databases


def _seeded(path: Path) -> str:
    url = database_url(path)
    with TestClient(create_app(url, token=TOKEN)) as c:
        assert c.post("/api/benchmarks", json=make_cell(), headers=AUTH).status_code == 201
        assert c.post("/api/validator", json=make_result(), headers=AUTH).status_code == 201
    Database(url).dispose()
    return url


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _serves_read_only(app) -> None:  # type: ignore[no-untyped-def]
    with TestClient(app) as c:
        for page in ("/", "/throughput", "/validation", "/api/benchmarks", "/healthz"):
            assert c.get(page).status_code == 200, page
        assert c.get("/healthz").json()["read_only"] is True
        r = c.post("/api/benchmarks", json=make_cell(variant="vllm"), headers=AUTH)
        assert r.status_code == 403 and "read-only" in r.json()["detail"]


def test_read_only_database_serves_pages_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "ro.sqlite"
    url = _seeded(path)
    before = _digest(path)
    db = Database(url, read_only=True)
    _serves_read_only(create_app(db, token=TOKEN))
    assert _count(db, BenchmarkCellRow) == 1
    db.dispose()
    assert _digest(path) == before


def test_an_unwritable_database_file_opens_read_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Detected from the file's permissions (faked here: root may write a 0444 file anyway)."""
    import os

    path = tmp_path / "perm.sqlite"
    url = _seeded(path)
    before = _digest(path)
    real_access = os.access
    monkeypatch.setattr(
        "ie_dashboard.db.os.access",
        lambda p, mode: False if mode == os.W_OK and str(p) == str(path) else real_access(p, mode),
    )
    db = Database(url)
    assert db.read_only
    _serves_read_only(create_app(db, token=TOKEN))
    db.dispose()
    assert _digest(path) == before


def test_cli_read_only_flag_serves_without_seeding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import uvicorn

    path = tmp_path / "cli-ro.sqlite"
    _seeded(path)
    before = _digest(path)
    apps: list[object] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: apps.append(app))
    assert dashboard_command(["--read-only", "--db", str(path)]) == 0
    assert "read-only" in capsys.readouterr().err
    _serves_read_only(apps[0])
    assert _digest(path) == before


def test_an_unmigrated_read_only_database_says_so(tmp_path: Path) -> None:
    url = database_url(tmp_path / "v3.sqlite")
    old = Database(url)
    migrate(old.engine, target=3)
    old.dispose()
    with pytest.raises(DatabaseError, match="schema version 3 and this dashboard needs 9"):
        create_app(Database(url, read_only=True))
    assert applied_versions(Database(url).engine) == [1, 2, 3]


def test_a_corrupt_database_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "corrupt.sqlite"
    path.write_bytes(b"this is not a database\n" * 400)
    with pytest.raises(DatabaseError, match="file is not a database"):
        create_app(str(path))
    assert dashboard_command(["--db", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ie dashboard: cannot read the dashboard database")
    assert "Traceback" not in err[0]
    assert dashboard_command(["seed", "--db", str(path)]) == 2


_RO_SCRIPT = """
import sys
from fastapi.testclient import TestClient
from ie_dashboard.app import create_app
from ie_dashboard.db import Database
db = Database("sqlite:///" + sys.argv[1])
assert db.read_only, "not detected"
with TestClient(create_app(db)) as c:
    codes = [c.get(p).status_code for p in ("/", "/throughput", "/validation", "/healthz")]
    post = c.post("/api/benchmarks", json={}, headers={"Authorization": "Bearer x"}).status_code
print(codes, post)
"""


def test_a_database_on_a_read_only_mount_serves(tmp_path: Path) -> None:
    """The real thing where the machine allows it: a WAL database on a read-only bind mount (no
    `-shm` beside it) is detected as unwritable and serves every page."""
    import shutil
    import subprocess
    import sys

    if shutil.which("unshare") is None:
        pytest.skip("needs util-linux `unshare` to make a read-only bind mount")
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir(), mnt.mkdir()
    db = Database(_seeded(src / "d.sqlite"))
    with db.engine.connect() as conn:  # fold the WAL into the file, as a copied database would be
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    db.dispose()
    for extra in ("d.sqlite-wal", "d.sqlite-shm"):
        (src / extra).unlink(missing_ok=True)
    before = _digest(src / "d.sqlite")
    (tmp_path / "check.py").write_text(_RO_SCRIPT)
    mount = f"mount --bind {src} {mnt} && mount -o remount,ro,bind {mnt}"
    probe = subprocess.run(["unshare", "-m", "sh", "-c", mount], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"no permission for a read-only bind mount here ({probe.stderr.strip()})")
    run = f"{mount} && {sys.executable} {tmp_path / 'check.py'} {mnt / 'd.sqlite'}"
    out = subprocess.run(["unshare", "-m", "sh", "-c", run], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[200, 200, 200, 200] 403"
    assert _digest(src / "d.sqlite") == before
    assert sorted(p.name for p in src.iterdir()) == ["d.sqlite"]
