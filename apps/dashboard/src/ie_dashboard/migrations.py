"""Versioned schema migrations: ordered steps recorded in `schema_migrations`, never drops.

Each step declares the tables as they were at that version (not the current ORM classes), so
replaying old steps on a new database always yields the same schema. Add a change as a new step.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from ie_dashboard.keys import cell_key, run_key
from ie_dashboard.postgres import one_migrator

_LEDGER = sa.Table(
    "schema_migrations",
    sa.MetaData(),
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("name", sa.String, nullable=False),
    sa.Column("applied_at", sa.String, nullable=False),
)


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    apply: Callable[[Connection], None]


def _registry_tables(conn: Connection) -> None:
    md = sa.MetaData()
    sa.Table(
        "points",
        md,
        sa.Column("name", sa.String, primary_key=True),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("scope", sa.String, nullable=False),
        sa.Column("width", sa.String, nullable=False),
        sa.Column("role", sa.String, nullable=False),
        sa.Column("definition", sa.String, nullable=False),
        sa.Column("requires", sa.String, nullable=True),
        sa.Column("vllm_service", sa.String, nullable=False),
        sa.Column("vllm_reason", sa.String, nullable=False),
        sa.Column("static_service", sa.String, nullable=False),
        sa.Column("static_reason", sa.String, nullable=False),
        sa.Column("tl_name", sa.String, nullable=True),
        sa.Column("nnsight_name", sa.String, nullable=True),
        sa.Column("nnterp_name", sa.String, nullable=True),
    )
    sa.Table(
        "traits",
        md,
        sa.Column("name", sa.String, primary_key=True),
        sa.Column("note", sa.String, nullable=False),
    )
    sa.Table(
        "architectures",
        md,
        sa.Column("slug", sa.String, primary_key=True),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("name", sa.String, nullable=False),
        sa.Column("hf_classes", sa.String, nullable=False),
        sa.Column("significance", sa.String, nullable=False),
        sa.Column("examples", sa.String, nullable=False),
        sa.Column("synthetic", sa.Boolean, nullable=False),
    )
    sa.Table(
        "architecture_traits",
        md,
        sa.Column("architecture", sa.String, sa.ForeignKey("architectures.slug"), primary_key=True),
        sa.Column("trait", sa.String, sa.ForeignKey("traits.name"), primary_key=True),
    )
    sa.Table(
        "architecture_points",
        md,
        sa.Column("architecture", sa.String, sa.ForeignKey("architectures.slug"), primary_key=True),
        sa.Column("point", sa.String, sa.ForeignKey("points.name"), primary_key=True),
        sa.Column("present", sa.Boolean, nullable=False),
        sa.Column("reason", sa.String, nullable=False),
    )
    md.create_all(conn)


def _benchmark_tables(conn: Connection) -> None:
    md = sa.MetaData()
    sa.Table(
        "benchmark_cells",
        md,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("cell_key", sa.String, nullable=False, unique=True),
        sa.Column("model", sa.String, nullable=False, index=True),
        sa.Column("variant", sa.String, nullable=False),
        sa.Column("started", sa.String, nullable=False),
        sa.Column("finished", sa.String, nullable=True),
        sa.Column("command", sa.String, nullable=False),
        sa.Column("device", sa.String, nullable=False),
        sa.Column("env_label", sa.String, nullable=False),
        sa.Column("env_json", sa.String, nullable=False),
        sa.Column("raw_json", sa.String, nullable=False),
        sa.Column("source", sa.String, nullable=False),
        sa.Column("ingested_at", sa.String, nullable=False),
    )
    sa.Table(
        "benchmark_workloads",
        md,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column(
            "cell_id", sa.Integer, sa.ForeignKey("benchmark_cells.id"), nullable=False, index=True
        ),
        sa.Column("workload", sa.String, nullable=False),
        sa.Column("status", sa.String, nullable=False),
        sa.Column("metrics_json", sa.String, nullable=False),
        sa.Column("detail", sa.String, nullable=False),
        sa.UniqueConstraint("cell_id", "workload"),
    )
    md.create_all(conn)


def _validator_tables(conn: Connection) -> None:
    md = sa.MetaData()
    sa.Table(
        "validator_runs",
        md,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_key", sa.String, nullable=False, unique=True),
        sa.Column("hf_id", sa.String, nullable=False, index=True),
        sa.Column("engine", sa.String, nullable=False),
        sa.Column("reference", sa.String, nullable=False),
        sa.Column("verdict", sa.String, nullable=False),
        sa.Column("captured_at", sa.String, nullable=False),
        sa.Column("status", sa.String, nullable=False),
        sa.Column("dtype", sa.String, nullable=False),
        sa.Column("device", sa.String, nullable=False),
        sa.Column("versions_json", sa.String, nullable=False),
        sa.Column("raw_json", sa.String, nullable=False),
        sa.Column("source", sa.String, nullable=False),
        sa.Column("ingested_at", sa.String, nullable=False),
    )
    sa.Table(
        "validator_points",
        md,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column(
            "run_id", sa.Integer, sa.ForeignKey("validator_runs.id"), nullable=False, index=True
        ),
        sa.Column("address", sa.String, nullable=False),
        sa.Column("point", sa.String, nullable=False),
        sa.Column("layer", sa.Integer, nullable=True),
        sa.Column("tier", sa.String, nullable=False),
        sa.Column("cos", sa.Float, nullable=True),
        sa.Column("max_abs_diff", sa.Float, nullable=True),
        sa.Column("rel_diff", sa.Float, nullable=True),
        sa.Column("status", sa.String, nullable=False),
        sa.Column("reason", sa.String, nullable=False),
        sa.UniqueConstraint("run_id", "address"),
    )
    md.create_all(conn)


def _cell_and_run_facts(conn: Connection) -> None:
    # The producers' schemas (ie-bench/cell/1, validator schema_version 1) carry these facts.
    for table, column in (
        ("benchmark_cells", "cell_id"),
        ("benchmark_cells", "profile"),
        ("benchmark_cells", "status"),
        ("validator_runs", "family"),
        ("validator_runs", "error"),
    ):
        conn.execute(
            sa.text(f"ALTER TABLE {table} ADD COLUMN {column} VARCHAR NOT NULL DEFAULT ''")
        )


def _engine_hook(conn: Connection) -> None:
    conn.execute(
        sa.text("ALTER TABLE validator_points ADD COLUMN engine_hook VARCHAR NOT NULL DEFAULT ''")
    )


def _profile_from_raw(raw_json: str) -> str:
    try:
        raw = json.loads(raw_json)
        name = raw["profile"]["name"]
    except (ValueError, KeyError, TypeError):
        return ""
    return name if isinstance(name, str) else ""


def _unambiguous_keys(conn: Connection) -> None:
    """Re-key every row with `keys.py`'s JSON-array encoding (was a `|` join that could collide).

    Cells stored before step 4 have an empty profile column; their profile comes back from the
    stored cell. Should two old rows still meet on one key, the later keeps a key naming its row
    id, so no row is dropped or merged here.
    """
    # Placeholders first (unique, and never a JSON array), so no new key meets an old one.
    conn.execute(sa.text("UPDATE benchmark_cells SET cell_key = 'migrating ' || id"))
    conn.execute(sa.text("UPDATE validator_runs SET run_key = 'migrating ' || id"))
    cells = conn.execute(
        sa.text(
            "SELECT id, model, variant, profile, started, raw_json FROM benchmark_cells ORDER BY id"
        )
    ).all()
    taken: set[str] = set()
    for id_, model, variant, profile, started, raw_json in cells:
        profile = profile or _profile_from_raw(raw_json)
        key = cell_key(model, variant, profile, started)
        if key in taken:
            key = cell_key(model, variant, profile, f"{started} (row {id_})")
        taken.add(key)
        conn.execute(
            sa.text("UPDATE benchmark_cells SET cell_key = :k, profile = :p WHERE id = :i"),
            {"k": key, "p": profile, "i": id_},
        )
    taken.clear()
    runs = conn.execute(
        sa.text("SELECT id, hf_id, engine, captured_at FROM validator_runs ORDER BY id")
    )
    for id_, hf_id, engine, captured_at in runs.all():
        key = run_key(hf_id, engine, captured_at)
        if key in taken:
            key = run_key(hf_id, engine, f"{captured_at} (row {id_})")
        taken.add(key)
        conn.execute(
            sa.text("UPDATE validator_runs SET run_key = :k WHERE id = :i"), {"k": key, "i": id_}
        )


def _graph_tables(conn: Connection) -> None:
    md = sa.MetaData()
    sa.Table(
        "attribution_graphs",
        md,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("graph_key", sa.String, nullable=False, unique=True),
        sa.Column("slug", sa.String, nullable=False, index=True),
        sa.Column("scan", sa.String, nullable=False),
        sa.Column("prompt", sa.String, nullable=False),
        sa.Column("node_threshold", sa.Float, nullable=True),
        sa.Column("n_nodes", sa.Integer, nullable=False),
        sa.Column("n_links", sa.Integer, nullable=False),
        sa.Column("raw_json", sa.String, nullable=False),
        sa.Column("source", sa.String, nullable=False),
        sa.Column("ingested_at", sa.String, nullable=False),
    )
    md.create_all(conn)


def _workload_records(conn: Connection) -> None:
    md = sa.MetaData()
    sa.Table(
        "workload_records",
        md,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("record_key", sa.String, nullable=False, unique=True),
        sa.Column("source", sa.String, nullable=False, index=True),
        sa.Column("section", sa.String, nullable=False),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("section_json", sa.String, nullable=False),
        sa.Column("raw_sha256", sa.String, nullable=False),
        sa.Column("ingested_at", sa.String, nullable=False),
    )
    md.create_all(conn)


def _atlas_tables(conn: Connection) -> None:
    md = sa.MetaData()
    sa.Table(
        "atlases",
        md,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("atlas_key", sa.String, nullable=False, unique=True),
        sa.Column("name", sa.String, nullable=False),
        sa.Column("model", sa.String, nullable=False),
        sa.Column("scan", sa.String, nullable=False, index=True),
        sa.Column("layer", sa.Integer, nullable=True),
        sa.Column("address", sa.String, nullable=False),
        sa.Column("d_sae", sa.Integer, nullable=False),
        sa.Column("tokens", sa.Integer, nullable=False),
        sa.Column("top_k", sa.Integer, nullable=False),
        sa.Column("spec_json", sa.String, nullable=False),
        sa.Column("source", sa.String, nullable=False),
        sa.Column("ingested_at", sa.String, nullable=False),
    )
    sa.Table(
        "atlas_features",
        md,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("atlas_id", sa.Integer, sa.ForeignKey("atlases.id"), nullable=False),
        sa.Column("feature", sa.Integer, nullable=False),
        sa.Column("fired", sa.Integer, nullable=False),
        sa.Column("density", sa.Float, nullable=False),
        sa.Column("max_act", sa.Float, nullable=False),
        sa.Column("mean_act", sa.Float, nullable=False),
        sa.Column("top_token", sa.String, nullable=False),
        sa.Column("token_key", sa.String, nullable=False),
        sa.Column("page_json", sa.String, nullable=False),
        sa.UniqueConstraint("atlas_id", "feature"),
        sa.Index("ix_atlas_features_density", "atlas_id", "density", "feature"),
        sa.Index("ix_atlas_features_max_act", "atlas_id", "max_act", "feature"),
        sa.Index("ix_atlas_features_token", "atlas_id", "token_key", "feature"),
    )
    md.create_all(conn)


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "registry: points, traits, architectures", _registry_tables),
    Migration(2, "benchmark cells and workloads", _benchmark_tables),
    Migration(3, "validator runs and point results", _validator_tables),
    Migration(4, "cell id, profile and status on cells; family and error on runs", _cell_and_run_facts),
    Migration(5, "the engine's own hook name per validator point", _engine_hook),
    Migration(6, "natural keys as JSON arrays instead of a '|' join", _unambiguous_keys),
    Migration(7, "attribution graphs (ie trace's JSON)", _graph_tables),
    Migration(8, "workload records (patch sweep, harvest, read-out, ...)", _workload_records),
    Migration(9, "atlases and their features (ie atlas folders)", _atlas_tables),
)  # fmt: skip


def applied_versions(engine: Engine) -> list[int]:
    with engine.connect() as conn:
        if not sa.inspect(conn).has_table("schema_migrations"):
            return []
        return [
            row[0] for row in conn.execute(sa.select(_LEDGER.c.version).order_by(_LEDGER.c.version))
        ]


def migrate(engine: Engine, *, target: int | None = None) -> list[int]:
    """Apply pending steps up to `target` (default: all), each in its own transaction."""
    with one_migrator(engine):
        return _apply(engine, target)


def _apply(engine: Engine, target: int | None) -> list[int]:
    _LEDGER.metadata.create_all(engine)
    applied: list[int] = []
    for step in MIGRATIONS:
        if target is not None and step.version > target:
            break
        with engine.begin() as conn:
            # Re-read inside the transaction so two processes starting at once apply a step once.
            done = conn.execute(
                sa.select(_LEDGER.c.version).where(_LEDGER.c.version == step.version)
            ).first()
            if done:
                continue
            step.apply(conn)
            conn.execute(
                _LEDGER.insert().values(
                    version=step.version, name=step.name, applied_at=datetime.now(UTC).isoformat()
                )
            )
            applied.append(step.version)
    return applied
