"""What the ingest API and the seed accept: a benchmark cell and a validator result.

The shapes are what `benchmarks/` (`ie-bench/cell/1`) and `validator/` (schema_version 1) write;
see their READMEs. Unknown extra fields are kept in the stored raw JSON.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

NonEmpty = Annotated[str, Field(min_length=1, max_length=500)]
# Every benchmark metric is a rate, a duration or a size: a negative one is a producer bug.
Metric = Annotated[float, Field(ge=0, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]
# A float64 cosine of two equal vectors can round to 1 + 2e-16; anything further out is not one.
Cosine = Annotated[float, Field(ge=-1 - 1e-6, le=1 + 1e-6, allow_inf_nan=False)]
MAX_LAYER = 100_000  # far beyond any model; keeps a layer inside SQLite's 64-bit integers


def _utc(value: datetime) -> datetime:
    """One instant, one key: a naive time is taken as UTC, an aware one converted to it."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("the time falls outside years 1-9999 once converted to UTC") from None


Instant = Annotated[datetime, AfterValidator(_utc)]
WorkloadStatus = Literal["ok", "unsupported", "error"]


class _Open(BaseModel):
    # Extra fields are kept; floats anywhere in a typed field must be finite.
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class ModelRef(_Open):
    """The benchmarked checkpoint: `model_id` is its HF or local id, `key` the sweep's short name."""

    key: NonEmpty
    model_id: NonEmpty
    label: str | None = None


class VariantRef(_Open):
    key: NonEmpty
    backend: NonEmpty
    label: str | None = None


class ProfileRef(_Open):
    name: NonEmpty
    dtype: str | None = None
    device: str | None = None


class WorkloadResult(_Open):
    status: WorkloadStatus
    metrics: dict[str, Metric] = Field(default_factory=dict)
    detail: dict[str, Any] | str | None = None


class BenchmarkCell(_Open):
    """One `(model, variant)` cell under one profile: schema `ie-bench/cell/1` (benchmarks/README.md)."""

    schema_id: Literal["ie-bench/cell/1"] = Field(alias="schema")
    cell_id: NonEmpty
    status: Literal["running", "ok", "partial", "error"]
    started_at: Instant
    finished_at: Instant | None
    command: list[str]
    model: ModelRef
    variant: VariantRef
    profile: ProfileRef
    environment: dict[str, Any]
    load: dict[str, Any]
    workloads: dict[str, WorkloadResult]
    error: dict[str, Any] | None


PointStatus = Literal["pass", "warn", "fail", "n/a", "unsupported", "error", "not_run"]


class PointResult(_Open):
    """One address compared; `status` n/a carries the reason one side cannot produce it."""

    point: NonEmpty
    layer: int | None = Field(default=None, ge=0, le=MAX_LAYER)
    tier: str = ""
    cos: Cosine | None = None
    max_abs_diff: NonNegative | None = None
    rel_diff: NonNegative | None = None
    status: PointStatus
    reason: str = ""
    engine_hook: str = ""

    @model_validator(mode="after")
    def _compared_points_carry_numbers(self) -> PointResult:
        # The validator only passes or warns a point after computing all three; a pass without
        # a cosine would show a verdict nothing backs.
        if self.status in ("pass", "warn"):
            missing = [k for k in ("cos", "max_abs_diff", "rel_diff") if getattr(self, k) is None]
            if missing:
                raise ValueError(f"a {self.status} point needs {', '.join(missing)}")
        return self

    @property
    def address(self) -> str:
        return self.point if self.layer is None else f"{self.point}.{self.layer}"


Verdict = Literal["pass", "warn", "fail", "unsupported", "error", "not_run"]


class ValidatorResult(_Open):
    """One `(model, engine)` comparison against the reference (validator/README.md, schema_version 1)."""

    hf_id: NonEmpty
    engine: NonEmpty
    reference: str = "eager"
    verdict: Verdict
    captured_at: Instant
    status: str = ""
    dtype: str = ""
    device: str = ""
    versions: dict[str, Any] = Field(default_factory=dict)
    family: str = ""
    architecture: str = ""
    error: str = ""
    schema_version: Literal[1] = 1
    points: list[PointResult] = Field(default_factory=list)

    @field_validator("points")
    @classmethod
    def _unique_addresses(cls, value: list[PointResult]) -> list[PointResult]:
        seen: set[str] = set()
        for p in value:
            if p.address in seen:
                raise ValueError(f"point {p.address} listed twice")
            seen.add(p.address)
        return value
