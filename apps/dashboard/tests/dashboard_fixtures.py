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


def make_graph(slug: str = "tiny") -> dict[str, Any]:
    """A small attribution graph in `ie trace`'s JSON (circuit-tracer's viewer format): three
    prompt tokens, two features, an error node and two logits, edges of both signs."""

    def node(node_id: str, layer: str, pos: int, kind: str, **extra: Any) -> dict[str, Any]:
        return {
            "node_id": node_id, "layer": layer, "ctx_idx": pos, "feature_type": kind,
            "feature": extra.pop("feature", None), "influence": extra.pop("influence", None),
            "activation": extra.pop("activation", None), "token_prob": 0.0, "clerp": "",
            **extra,
        }  # fmt: skip

    nodes = [
        node("E_5_0", "E", 0, "embedding"),
        node("E_9_1", "E", 1, "embedding"),
        node("E_2_2", "E", 2, "embedding"),
        node("0_3_1", "0", 1, "cross layer transcoder", feature=9, influence=0.31, activation=1.5),
        node(
            "1_4_2", "1", 2, "cross layer transcoder", feature=19, influence=0.12, activation=2.25
        ),
        node("0_1_2", "1", 2, "mlp reconstruction error"),
        node("3_42_2", "3", 2, "logit", token_prob=0.61, clerp='Output " Paris" (p=0.610)'),
        node("3_17_2", "3", 2, "logit", token_prob=0.2, clerp='Output " Lyon" (p=0.200)'),
    ]
    links = [
        {"source": "E_9_1", "target": "0_3_1", "weight": 0.75},
        {"source": "0_3_1", "target": "1_4_2", "weight": 1.25},
        {"source": "E_2_2", "target": "1_4_2", "weight": -0.5},
        {"source": "1_4_2", "target": "3_42_2", "weight": 2.5},
        {"source": "0_1_2", "target": "3_42_2", "weight": 0.25},
        {"source": "1_4_2", "target": "3_17_2", "weight": -0.375},
    ]
    metadata = {
        "slug": slug, "scan": "ie-synthetic/llama", "prompt": "Paris is in",
        "prompt_tokens": ["Paris", " is", " in"], "node_threshold": 0.8, "schema_version": 1,
    }  # fmt: skip
    return {"metadata": metadata, "qParams": {}, "nodes": nodes, "links": links}
