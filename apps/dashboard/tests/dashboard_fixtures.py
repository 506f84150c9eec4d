"""Builders for benchmark cells and validator results in the producers' formats (figures chosen)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

BACKENDS = ("sqlite", "postgresql")  # every `db` / `client` test runs on both (conftest.py)
TOKEN = "test-write-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def make_cell(
    model_id: str = "HuggingFaceTB/SmolLM2-135M-Instruct",
    variant: str = "eager",
    *,
    decode: float | None = 20.0,
    aggregate: float | None = 19.0,
    started: str = "2026-11-29T08:00:00+00:00",
    cpu: str = "Test CPU",
    profile: str = "cpu",
) -> dict[str, Any]:
    """A cell as `ie bench cell` writes it (schema ie-bench/cell/1)."""

    def ok(**metrics: float) -> dict[str, Any]:
        return {
            "status": "ok",
            "metrics": metrics,
            "samples": {k: [v] for k, v in metrics.items()},
            "detail": {},
        }

    def failed() -> dict[str, Any]:
        return {
            "status": "error",
            "metrics": {},
            "samples": {},
            "detail": {"error_type": "RuntimeError", "message": "engine died"},
        }

    key = model_id.rsplit("/", 1)[-1].lower()
    return {
        "schema": "ie-bench/cell/1",
        "cell_id": f"{key}__{variant}",
        "status": "ok",
        "started_at": started,
        "finished_at": started,
        "command": ["ie", "bench", "cell", "--model", key, "--variant", variant],
        "model": {"key": key, "model_id": model_id, "label": key, "capture_point": "resid_post"},
        "variant": {
            "key": variant,
            "backend": variant,
            "label": variant,
            "description": "",
            "capture_capable": True,
        },
        "profile": {
            "name": profile,
            "dtype": "float32",
            "device": "cpu",
            "prompt_tokens": 128,
            "new_tokens": 32,
            "concurrency": 8,
        },
        "environment": {"cpu": cpu, "cpu_count": 2, "gpu": None, "versions": {"torch": "2.13.0"}},
        "load": {"dtype_resolved": "float32", "device": "cpu", "load_s": 1.0},
        "workloads": {
            "generate": ok(decode_tok_s=decode, ttft_s=0.5) if decode is not None else failed(),
            "generate_x8": ok(aggregate_tok_s=aggregate, wall_s=3.0)
            if aggregate is not None
            else failed(),
            "capture_mid": {
                "status": "unsupported",
                "metrics": {},
                "samples": {},
                "detail": {"message": "refused"},
            },
        },
        "error": None,
    }


def make_result(
    hf_id: str = "ie-synthetic/llama",
    engine: str = "nnsight",
    *,
    verdict: str = "pass",
    captured_at: str = "2026-11-29T08:00:00+00:00",
    layers: tuple[int, ...] = (0, 1, 3),
) -> dict[str, Any]:
    """A result as the validator writes it (schema_version 1)."""
    points = [
        {"point": "embeddings", "layer": None, "address": "embeddings", "tier": "raw-hf", "status": "pass",
         "cos": 1.0, "max_abs_diff": 0.0, "rel_diff": 0.0, "reason": ""},
    ]  # fmt: skip
    for layer in layers:
        for name in ("resid_post", "attn_out"):
            points.append(
                {"point": name, "layer": layer, "address": f"{name}.{layer}", "tier": "raw-hf",
                 "status": "pass", "cos": 0.9999991, "max_abs_diff": 2e-6, "rel_diff": 1e-6, "reason": "",
                 "engine_hook": f"model.layers[{layer}].output"}
            )  # fmt: skip
    points.append(
        {"point": "q_norm_in", "layer": 0, "address": "q_norm_in.0", "tier": "raw-hf", "status": "n/a",
         "cos": None, "max_abs_diff": None, "rel_diff": None, "reason": "llama has no QK-norm"}
    )  # fmt: skip
    return {
        "hf_id": hf_id,
        "engine": engine,
        "reference": "eager",
        "verdict": verdict,
        "status": "ok",
        "captured_at": captured_at,
        "dtype": "float32",
        "device": "cpu",
        "family": "llama",
        "architecture": "LlamaForCausalLM",
        "tier": "raw-hf",
        "prompt": "The capital of France is",
        "token_ids": [1, 2, 3],
        "layers": list(layers),
        "versions": {"torch": "2.13.0"},
        "summary": {"pass": len(points) - 1, "n/a": 1},
        "points": points,
        "error": "",
        "schema_version": 1,
    }


def write_json(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path
