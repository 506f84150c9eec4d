"""Hand-built cells for report and publish tests: the figures are chosen, not measured."""

from __future__ import annotations

import copy
from typing import Any

from ie_bench.cells import SCHEMA, cell_id
from ie_bench.spec import get_model, get_profile, get_variant


def _ok(**metrics: float) -> dict[str, Any]:
    return {
        "status": "ok",
        "metrics": metrics,
        "samples": {k: [v] for k, v in metrics.items()},
        "detail": {},
    }


def make_cell(
    model: str,
    variant: str,
    *,
    decode: float | None,
    aggregate: float | None,
    dtype: str = "float32",
    cpu: str = "Test CPU",
    gpu: dict[str, Any] | None = None,
    unsupported_capture: bool = False,
) -> dict[str, Any]:
    m, v, p = get_model(model), get_variant(variant), get_profile("cpu")
    workloads: dict[str, Any] = {
        "generate": _ok(decode_tok_s=decode, ttft_s=0.5, prefill_tok_s=256.0, total_s=2.0)
        if decode is not None
        else {
            "status": "error",
            "metrics": {},
            "samples": {},
            "detail": {"error_type": "RuntimeError", "message": "engine died"},
        },
        "generate_x8": _ok(aggregate_tok_s=aggregate, wall_s=3.0)
        if aggregate is not None
        else {
            "status": "error",
            "metrics": {},
            "samples": {},
            "detail": {"error_type": "RuntimeError", "message": "engine died"},
        },
    }
    for name in ("capture_mid", "capture_all", "capture_gen", "steer", "lens_topk"):
        if unsupported_capture:
            workloads[name] = {
                "status": "unsupported",
                "metrics": {},
                "samples": {},
                "detail": {
                    "error_type": "UnsupportedOperationError",
                    "message": "vllm-generate cannot capture",
                },
            }
        else:
            workloads[name] = _ok(latency_s=1.0 if name != "steer" else 1.25, mib=0.5)
    return {
        "schema": SCHEMA,
        "cell_id": cell_id(m.key, v.key),
        "status": "ok" if decode is not None else "partial",
        "started_at": "2026-11-29T08:00:00+00:00",
        "finished_at": "2026-11-29T08:05:00+00:00",
        "command": ["ie", "bench", "cell"],
        "model": {
            "key": m.key,
            "model_id": m.model_id,
            "label": m.label,
            "capture_point": "resid_post",
            "n_layers": 30,
            "d_model": 576,
            "mid_layer": 15,
        },
        "variant": {
            "key": v.key,
            "backend": v.backend,
            "label": v.label,
            "description": v.description,
            "capture_capable": v.capture_capable,
        },
        "profile": p.as_dict(),
        "environment": {
            "cpu": cpu,
            "cpu_count": 2,
            "memory_gib": 24.0,
            "gpu": gpu,
            "versions": {"torch": "2.13.0", "python": "3.12.0"},
            "git": "abc",
            "loadavg": [0.1, 0.1, 0.1],
        },
        "load": {
            "dtype_requested": "float32",
            "dtype_resolved": dtype,
            "device": "cpu",
            "load_s": 1.0,
            "kwargs": {},
        },
        "workloads": workloads,
        "error": None,
    }


def sweep_cells() -> list[dict[str, Any]]:
    """A four-variant row whose rounded figures would give different multipliers than the raw ones."""
    return [
        make_cell("smollm2-135m", "eager", decode=10.4, aggregate=10.2),
        make_cell("smollm2-135m", "vllm", decode=25.4, aggregate=80.6),
        make_cell("smollm2-135m", "vllm-static", decode=None, aggregate=120.0),
        make_cell(
            "smollm2-135m", "vllm-generate", decode=60.0, aggregate=300.0, unsupported_capture=True
        ),
    ]


def variant_of(cells: list[dict[str, Any]], variant: str) -> dict[str, Any]:
    return copy.deepcopy(next(c for c in cells if c["variant"]["key"] == variant))
