"""Schema migrations: ordered, recorded, never dropping data, and agreeing with the ORM classes,
on SQLite and on PostgreSQL (`db_url` gives each test a fresh database of each backend)."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from dashboard_fixtures import make_cell
from ie_core.tooling.records import BenchmarkCell
from ie_dashboard import tables  # noqa: F401  (registers the ORM tables on SQLModel.metadata)
from ie_dashboard.config import database_url
from ie_dashboard.db import Database
from ie_dashboard.ingest import upsert_cell
from ie_dashboard.migrations import MIGRATIONS, applied_versions
from ie_dashboard.tables import BenchmarkCellRow
from sqlmodel import SQLModel, select


def test_versions_are_ordered_and_unique() -> None:
    versions = [m.version for m in MIGRATIONS]
    assert versions == sorted(set(versions)) == list(range(1, len(versions) + 1))


def _shape(engine: sa.Engine, name: str) -> tuple[object, ...]:
    i = sa.inspect(engine)
    columns = {
        c["name"]: (str(c["type"]), c["nullable"], bool(c.get("primary_key")))
        for c in i.get_columns(name)
    }
    unique = {tuple(u["column_names"]) for u in i.get_unique_constraints(name)}
    unique |= {tuple(x["column_names"]) for x in i.get_indexes(name) if x["unique"]}
    indexes = {tuple(x["column_names"]) for x in i.get_indexes(name) if not x["unique"]}
    fks = {(tuple(f["constrained_columns"]), f["referred_table"]) for f in i.get_foreign_keys(name)}
    return columns, unique, indexes, fks


@pytest.fixture
def orm_url(db_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A second empty database of `db_url`'s backend, for what the ORM classes create."""
    if db_url.startswith("sqlite"):
        return database_url(tmp_path / "orm.sqlite")
    return request.getfixturevalue("pg_server").create_database()


def test_migrated_schema_matches_the_orm(db_url: str, orm_url: str) -> None:
    """Replaying every step gives what the ORM classes would create: columns with their types,
    nullability and keys, unique constraints, indexes and foreign keys."""
    db = Database(db_url)
    assert db.migrate() == [m.version for m in MIGRATIONS]
    assert db.migrate() == []  # a second run is a no-op
    orm = Database(orm_url).engine
    SQLModel.metadata.create_all(orm)
    for name in SQLModel.metadata.tables:
        if name not in {
            "points",
            "traits",
            "architectures",
            "architecture_traits",
            "architecture_points",
            "benchmark_cells",
            "benchmark_workloads",
            "validator_runs",
            "validator_points",
            "workload_records",
        }:
            continue  # fmt: skip
        assert _shape(db.engine, name) == _shape(orm, name), name
    orm.dispose()
    db.dispose()


def test_upgrading_keeps_existing_rows(db_url: str) -> None:
    """A database left at version 3 by an older release gains the new columns and keeps its cells."""
    url = db_url
    old = Database(url)
    from ie_dashboard.migrations import migrate

    migrate(old.engine, target=3)
    assert applied_versions(old.engine) == [1, 2, 3]
    with old.engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO benchmark_cells (cell_key, model, variant, started, finished, command, device,"
                " env_label, env_json, raw_json, source, ingested_at) VALUES ('k', 'old-model', 'eager',"
                " '2026-01-01T00:00:00+00:00', NULL, '', 'cpu', 'old box', '{}', '{}', 'test', '')"
            )
        )
    old.dispose()
    new = Database(url)
    assert new.migrate() == [4, 5, 6, 7, 8, 9]
    with new.write() as s:
        upsert_cell(s, BenchmarkCell.model_validate(make_cell()), source="test")
    with new.read() as s:
        rows = {r.model: r for r in s.exec(select(BenchmarkCellRow))}
    assert rows["old-model"].env_label == "old box" and rows["old-model"].profile == ""
    assert rows["HuggingFaceTB/SmolLM2-135M-Instruct"].profile == "cpu"
    new.dispose()
