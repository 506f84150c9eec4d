"""The ORM view of the tables. Their DDL lives in `migrations.py`; a test checks that the two agree
column by column (type, nullability, keys, unique constraints, indexes, foreign keys)."""

from __future__ import annotations

from sqlalchemy import Index, UniqueConstraint
from sqlmodel import Field, SQLModel


class PointRow(SQLModel, table=True):
    __tablename__ = "points"  # type: ignore[assignment]

    name: str = Field(primary_key=True)
    position: int
    scope: str
    width: str
    role: str
    definition: str
    requires: str | None = None
    vllm_service: str
    vllm_reason: str = ""
    static_service: str
    static_reason: str = ""
    tl_name: str | None = None
    nnsight_name: str | None = None
    nnterp_name: str | None = None


class TraitRow(SQLModel, table=True):
    __tablename__ = "traits"  # type: ignore[assignment]

    name: str = Field(primary_key=True)
    note: str


class ArchitectureRow(SQLModel, table=True):
    __tablename__ = "architectures"  # type: ignore[assignment]

    slug: str = Field(primary_key=True)
    position: int
    name: str
    hf_classes: str  # space separated
    significance: str
    examples: str  # space separated HF ids
    synthetic: bool


class ArchitectureTraitRow(SQLModel, table=True):
    __tablename__ = "architecture_traits"  # type: ignore[assignment]

    architecture: str = Field(primary_key=True, foreign_key="architectures.slug")
    trait: str = Field(primary_key=True, foreign_key="traits.name")


class ArchitecturePointRow(SQLModel, table=True):
    __tablename__ = "architecture_points"  # type: ignore[assignment]

    architecture: str = Field(primary_key=True, foreign_key="architectures.slug")
    point: str = Field(primary_key=True, foreign_key="points.name")
    present: bool
    reason: str = ""


class BenchmarkCellRow(SQLModel, table=True):
    __tablename__ = "benchmark_cells"  # type: ignore[assignment]

    id: int | None = Field(default=None, primary_key=True)
    cell_key: str = Field(unique=True)  # keys.cell_key: the same cell twice is one row
    model: str = Field(index=True)
    variant: str
    started: str
    finished: str | None = None
    command: str = ""
    device: str = ""
    env_label: str = ""
    env_json: str = "{}"
    raw_json: str = "{}"
    source: str = ""
    ingested_at: str = ""
    cell_id: str = ""  # the producer's id, `<model key>__<variant key>`
    profile: str = ""
    status: str = ""


class WorkloadRow(SQLModel, table=True):
    __tablename__ = "benchmark_workloads"  # type: ignore[assignment]
    __table_args__ = (UniqueConstraint("cell_id", "workload"),)

    id: int | None = Field(default=None, primary_key=True)
    cell_id: int = Field(foreign_key="benchmark_cells.id", index=True)
    workload: str
    status: str
    metrics_json: str = "{}"
    detail: str = ""


class WorkloadRecordRow(SQLModel, table=True):
    """One section of a workload record (`records.py`): the figures as read at ingest."""

    __tablename__ = "workload_records"  # type: ignore[assignment]

    id: int | None = Field(default=None, primary_key=True)
    record_key: str = Field(unique=True)  # keys.record_key: (record file, section)
    source: str = Field(index=True)  # the record file, relative to the seeded folder
    section: str
    position: int  # the page's order: RECORDS order, then the record's own
    section_json: str  # records.Section.to_json()
    raw_sha256: str  # of the record file's bytes, to tell which version was read
    ingested_at: str = ""


class ValidatorRunRow(SQLModel, table=True):
    __tablename__ = "validator_runs"  # type: ignore[assignment]

    id: int | None = Field(default=None, primary_key=True)
    run_key: str = Field(unique=True)  # keys.run_key
    hf_id: str = Field(index=True)
    engine: str
    reference: str = ""
    verdict: str
    captured_at: str
    status: str = ""
    dtype: str = ""
    device: str = ""
    versions_json: str = "{}"
    raw_json: str = "{}"
    source: str = ""
    ingested_at: str = ""
    family: str = ""
    error: str = ""


class ValidatorPointRow(SQLModel, table=True):
    __tablename__ = "validator_points"  # type: ignore[assignment]
    __table_args__ = (UniqueConstraint("run_id", "address"),)

    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(foreign_key="validator_runs.id", index=True)
    address: str
    point: str
    layer: int | None = None
    tier: str = ""
    cos: float | None = None
    max_abs_diff: float | None = None
    rel_diff: float | None = None
    status: str
    reason: str = ""
    engine_hook: str = ""  # the peer engine's own name for the point


class GraphRow(SQLModel, table=True):
    __tablename__ = "attribution_graphs"  # type: ignore[assignment]

    id: int | None = Field(default=None, primary_key=True)
    graph_key: str = Field(unique=True)  # keys.graph_key: the same graph twice is one row
    slug: str = Field(index=True)
    scan: str = ""
    prompt: str = ""
    node_threshold: float | None = None
    n_nodes: int
    n_links: int
    raw_json: str  # the checked graph as posted, re-read by the graph page
    source: str = ""
    ingested_at: str = ""


class AtlasRow(SQLModel, table=True):
    """One imported `ie atlas` folder: what it read (model, dictionary, layer) and its size."""

    __tablename__ = "atlases"  # type: ignore[assignment]

    id: int | None = Field(default=None, primary_key=True)
    atlas_key: str = Field(unique=True)  # keys.atlas_key: the same folder twice is one row
    name: str
    model: str
    scan: str = Field(index=True)  # the transcoder set's name, matched to a graph's `scan`
    layer: int | None = None
    address: str
    d_sae: int
    tokens: int
    top_k: int
    spec_json: str  # the folder's atlas.json spec and info, as read
    source: str = ""
    ingested_at: str = ""


class AtlasFeatureRow(SQLModel, table=True):
    """One feature of an atlas. The index page reads the small columns through the indexes below
    (a page of rows, never the whole table); the feature page reads `page_json` of one row."""

    __tablename__ = "atlas_features"  # type: ignore[assignment]
    __table_args__ = (
        UniqueConstraint("atlas_id", "feature"),
        Index("ix_atlas_features_density", "atlas_id", "density", "feature"),
        Index("ix_atlas_features_max_act", "atlas_id", "max_act", "feature"),
        Index("ix_atlas_features_token", "atlas_id", "token_key", "feature"),
    )

    id: int | None = Field(default=None, primary_key=True)
    atlas_id: int = Field(foreign_key="atlases.id")
    feature: int
    fired: int  # tokens where it fired (activation > 0)
    density: float
    max_act: float
    mean_act: float
    top_token: str  # the token at the feature's largest activation, decoded
    token_key: str  # top_token stripped and case-folded: what the token search matches
    page_json: str  # contexts, band samples, histogram and logits (atlas_import.feature_page)
