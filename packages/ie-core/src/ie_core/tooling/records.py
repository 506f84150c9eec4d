"""The wire records every producer writes and every reader checks: a benchmark cell and a
validator result. ie-bench validates each cell against `BenchmarkCell` before writing it, the
validator builds `ValidatorResult` itself, and the dashboard's ingest API and seed accept exactly
these; so a field is declared once, here. Documented in benchmarks/README.md ("Cell JSON") and
validator/README.md ("Result schema"). Unknown extra fields are kept.

Needs pydantic: `pip install 'ie-core[records]'`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    field_validator,
    model_validator,
)

CELL_SCHEMA = "ie-bench/cell/1"
VALIDATOR_SCHEMA_VERSION = 1

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


# Written back as the producers always wrote it: ISO 8601 with seconds and "+00:00".
Instant = Annotated[
    datetime,
    AfterValidator(_utc),
    PlainSerializer(lambda t: t.isoformat(timespec="seconds"), return_type=str, when_used="json"),
]
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
    address: str = ""  # point.layer as written by the validator; derived when absent
    tier: str = ""
    status: PointStatus
    cos: Cosine | None = None
    max_abs_diff: NonNegative | None = None
    rel_diff: NonNegative | None = None
    worst_token: int | None = None
    worst_token_max_abs_diff: NonNegative | None = None
    worst_token_cos: Cosine | None = None
    reason: str = ""
    engine_hook: str = ""
    shape: list[int] | None = None

    @model_validator(mode="after")
    def _compared_points_carry_numbers(self) -> PointResult:
        # The validator only passes or warns a point after computing all three; a pass without
        # a cosine would show a verdict nothing backs.
        if self.status in ("pass", "warn"):
            missing = [k for k in ("cos", "max_abs_diff", "rel_diff") if getattr(self, k) is None]
            if missing:
                raise ValueError(f"a {self.status} point needs {', '.join(missing)}")
        return self

    @model_validator(mode="after")
    def _address_names_the_point(self) -> PointResult:
        expected = self.point if self.layer is None else f"{self.point}.{self.layer}"
        if not self.address:
            self.address = expected
        elif self.address != expected:
            raise ValueError(f"address {self.address!r} does not name {expected!r}")
        return self


Verdict = Literal["pass", "warn", "fail", "unsupported", "error", "not_run"]


class ValidatorResult(_Open):
    """One `(model, engine)` comparison against the reference (validator/README.md, schema_version 1)."""

    hf_id: NonEmpty
    engine: NonEmpty
    reference: str = "eager"
    verdict: Verdict
    status: str = ""  # ok | engine_error | reference_error
    captured_at: Instant
    dtype: str = ""
    # The checkpoint's quantization scheme (`w8a8`, `w4a16`, `fp8`); empty at full precision.
    quantization: str = ""
    device: str = ""
    family: str = ""
    architecture: str = ""
    tier: str = ""
    prompt: str = ""
    token_ids: list[int] = Field(default_factory=list)
    layers: list[int] = Field(default_factory=list)
    versions: dict[str, Any] = Field(default_factory=dict)
    summary: dict[str, int] = Field(default_factory=dict)
    points: list[PointResult] = Field(default_factory=list)
    error: str = ""
    schema_version: Literal[1] = VALIDATOR_SCHEMA_VERSION

    def to_json(self) -> dict[str, Any]:
        """The file's JSON object, fields in declaration order."""
        return self.model_dump(mode="json", by_alias=True)

    @field_validator("points")
    @classmethod
    def _unique_addresses(cls, value: list[PointResult]) -> list[PointResult]:
        seen: set[str] = set()
        for p in value:
            if p.address in seen:
                raise ValueError(f"point {p.address} listed twice")
            seen.add(p.address)
        return value


def problems(record: type[BaseModel], data: Any) -> list[str]:
    """What is wrong with `data` as a `record`, one sentence per problem; empty when it is valid."""
    try:
        record.model_validate(data)
    except ValidationError as exc:
        return [
            f"{'.'.join(str(p) for p in e['loc']) or 'the record'}: {e['msg']}"
            for e in exc.errors(include_url=False)
        ]
    return []


__all__ = [
    "CELL_SCHEMA",
    "VALIDATOR_SCHEMA_VERSION",
    "BenchmarkCell",
    "ModelRef",
    "PointResult",
    "ProfileRef",
    "ValidatorResult",
    "VariantRef",
    "WorkloadResult",
    "problems",
]
