"""The committed circuit-tracer parity record (docs/notes/circuit_tracer_parity.json, written by
packages/ie-core/scripts/circuit_tracer_parity.py with circuit-tracer 0.5.0 in its own
environment) still says what the docs claim: on two synthetic families and SmolLM2 the node sets
are equal and the adjacency is within 1e-4 relative, and its numbers agree with each other."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
RECORD = ROOT / "docs" / "notes" / "circuit_tracer_parity.json"


def test_the_record_covers_the_families_within_tolerance() -> None:
    record = json.loads(RECORD.read_text())
    assert (ROOT / record["script"]).is_file()
    assert record["circuit_tracer_env"]["circuit-tracer"] == "0.5.0"
    assert record["tolerance"] == 1e-4
    families = record["families"]
    assert {"llama", "qwen3", "smollm2"} <= set(families)
    for name, r in families.items():
        assert r["pass"] and r["node_sets_equal"], name
        assert r["active_features"] > 100 and r["logit_targets"], name
        # The relative figure is the absolute one over the adjacency's scale, and within bounds.
        assert (
            abs(r["adjacency_max_rel_diff"] - r["adjacency_max_abs_diff"] / r["adjacency_max_abs"])
            <= 1e-12
        )
        assert r["adjacency_max_rel_diff"] <= record["tolerance"], name
        # Nodes: features, (layers + 1) x positions errors and tokens, logits.
        assert r["nodes"] > r["active_features"] + len(r["logit_targets"]), name
