"""The model's memory page (`/fit`): `ie fit`'s table for a model on a backend, against a GPU
by name or this machine, from config.json and the safetensors headers only (`ie_core.fit`).
Live only: the static export has no server to read a model's headers."""

from __future__ import annotations

from dataclasses import dataclass

from ie_core.errors import InterpError
from ie_core.fit import GPU_MIB, FitReport, fit

__all__ = ["FitQuery", "FitResult", "fit_result"]


@dataclass(frozen=True)
class FitQuery:
    model: str
    backend: str = "vllm"
    gpu: str = ""
    tokens: int | None = None
    attribute: int | None = None


@dataclass(frozen=True)
class FitResult:
    query: FitQuery
    report: FitReport | None
    refusal: str  # why there is no report ("" when there is one)
    gpus: tuple[str, ...] = tuple(GPU_MIB)


def fit_result(query: FitQuery) -> FitResult:
    """The report, or `ie fit`'s refusal as the page's message (bad input loses nothing: the
    form keeps the query)."""
    try:
        report = fit(
            query.model, query.backend, gpu=query.gpu or None, max_model_len=query.tokens,
            attribute_tokens=query.attribute, hub=False,
        )  # fmt: skip
    except (InterpError, ValueError, OSError, NotImplementedError, ImportError) as exc:
        return FitResult(query, None, str(exc))
    return FitResult(query, report, "")
