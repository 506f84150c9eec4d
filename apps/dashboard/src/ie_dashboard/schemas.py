"""What the ingest API and the seed accept: a benchmark cell and a validator result.

The shapes follow what `benchmarks/` and `validator/` write (see their READMEs). Unknown extra
fields are kept in the stored raw JSON, so a producer can add fields without breaking ingest.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

NonEmpty = Annotated[str, Field(min_length=1, max_length=500)]
WorkloadStatus = Literal["ok", "unsupported", "error"]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ModelRef(_Open):
    """The benchmarked checkpoint: `model_id` is the HF id or local id; `key`/`label` are short names."""

    model_id: NonEmpty
    key: str | None = None
    label: str | None = None


class WorkloadResult(_Open):
    workload: NonEmpty
    status: WorkloadStatus
    metrics: dict[str, float | int | None] = Field(default_factory=dict)
    detail: str | dict[str, Any] | list[Any] | None = None


class BenchmarkCell(_Open):
    """One `(model, variant)` cell: one process, every workload, the environment it ran in."""

    started: datetime
    finished: datetime | None = None
    command: str | list[str] = ""
    model: ModelRef
    variant: NonEmpty
    environment: dict[str, Any]
    workloads: list[WorkloadResult] = Field(min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _accept_shorthands(cls, data: Any) -> Any:
        """A bare model id string, and workloads keyed by name, are the same cell."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if isinstance(data.get("model"), str):
            data["model"] = {"model_id": data["model"]}
        workloads = data.get("workloads")
        if isinstance(workloads, dict):
            data["workloads"] = [
                {"workload": name, **body} if isinstance(body, dict) else body
                for name, body in workloads.items()
            ]
        return data

    @field_validator("workloads")
    @classmethod
    def _unique_workloads(cls, value: list[WorkloadResult]) -> list[WorkloadResult]:
        names = [w.workload for w in value]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"workload listed twice: {', '.join(dup)}")
        return value


PointStatus = Literal["pass", "warn", "fail", "unsupported", "n/a", "error", "not_run"]


class PointResult(_Open):
    point: NonEmpty
    layer: int | None = Field(default=None, ge=0)
    tier: str = ""
    cos: float | None = None
    max_abs_diff: float | None = None
    rel_diff: float | None = None
    status: PointStatus
    reason: str = ""

    @property
    def address(self) -> str:
        return self.point if self.layer is None else f"{self.point}.{self.layer}"


Verdict = Literal["pass", "warn", "fail", "unsupported", "error", "not_run"]


class ValidatorResult(_Open):
    """One `(model, engine)` comparison against the reference engine."""

    hf_id: NonEmpty
    engine: NonEmpty
    reference: str = "eager"
    verdict: Verdict
    captured_at: datetime
    status: str = ""
    dtype: str = ""
    device: str = ""
    versions: dict[str, Any] = Field(default_factory=dict)
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
