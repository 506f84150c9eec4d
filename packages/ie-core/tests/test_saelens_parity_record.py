"""The committed SAELens parity record (docs/notes/saelens_parity.json, written by
packages/ie-core/scripts/saelens_parity.py from sae-lens in its own environment) still says what
the docs claim: every architecture encoded equal to SAELens's own `encode` within 1e-5."""

from __future__ import annotations

import json
from pathlib import Path

RECORD = Path(__file__).resolve().parents[3] / "docs" / "notes" / "saelens_parity.json"


def test_the_record_covers_every_architecture_within_tolerance() -> None:
    record = json.loads(RECORD.read_text())
    assert "saelens_parity.py" in record["command"] and "error" not in record
    results = record["results"]
    assert set(results) == {"standard", "jumprelu", "topk", "transcoder"}
    for arch, r in results.items():
        assert r["max_abs_diff"] <= 1e-5, arch
        assert r["same_active_set"] and r["mean_active_features"] > 0, arch
