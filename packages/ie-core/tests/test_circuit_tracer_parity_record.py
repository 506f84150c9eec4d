"""The committed circuit-tracer parity record (docs/notes/circuit_tracer_parity.json, written by
packages/ie-core/scripts/circuit_tracer_parity.py with circuit-tracer 0.5.0 in its own
environment) still says what the docs claim: on two synthetic families and SmolLM2 through
per-layer transcoders, and on the two synthetic families through a cross-layer transcoder, the
node sets are equal and the adjacency is within 1e-4 relative, and its numbers agree with each
other."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
RECORD = ROOT / "docs" / "notes" / "circuit_tracer_parity.json"


def _check_row(name: str, r: dict[str, Any], tolerance: float) -> None:
    assert r["pass"] and r["node_sets_equal"], name
    assert r["active_features"] > 100 and r["logit_targets"], name
    # The relative figure is the absolute one over the adjacency's scale, and within bounds.
    assert (
        abs(r["adjacency_max_rel_diff"] - r["adjacency_max_abs_diff"] / r["adjacency_max_abs"])
        <= 1e-12
    )
    assert r["adjacency_max_rel_diff"] <= tolerance, name
    # Nodes: features, (layers + 1) x positions errors and tokens, logits.
    assert r["nodes"] > r["active_features"] + len(r["logit_targets"]), name


def test_the_record_covers_the_families_within_tolerance() -> None:
    record = json.loads(RECORD.read_text())
    assert (ROOT / record["script"]).is_file()
    assert record["circuit_tracer_env"]["circuit-tracer"] == "0.5.0"
    assert record["tolerance"] == 1e-4
    families = record["families"]
    assert {"llama", "qwen3", "smollm2"} <= set(families)
    for name, r in families.items():
        assert r["transcoder_kind"] == "transcoder_set", name
        _check_row(name, r, record["tolerance"])


def test_the_record_covers_a_cross_layer_transcoder() -> None:
    record = json.loads(RECORD.read_text())
    cross = record["cross_layer_families"]
    assert {"llama", "qwen3"} <= set(cross)
    for name, r in cross.items():
        assert r["transcoder_kind"] == "cross_layer_transcoder", name
        _check_row(f"{name} (CLT)", r, record["tolerance"])
        # The same model and prompt as the per-layer row: only the transcoder differs.
        same = record["families"][name]
        assert (r["model"], r["prompt_tokens"]) == (same["model"], same["prompt_tokens"]), name
