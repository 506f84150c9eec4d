"""The committed PP=2 sweep (`scripts/pipeline_sweep.py`, no engine here): every family serves at
PP=2 exactly what hooked vLLM serves at PP=1 (the committed capabilities sweep), within the
cross-engine tolerance of eager, its stages splitting the layers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
SWEEP = HERE / "data/pipeline_sweep.json"
PP1 = HERE.parents[1] / "ie-core/src/ie_core/data/capabilities/vllm.json"


def _sweep() -> dict[str, Any]:
    return json.loads(SWEEP.read_text())


def _pp1(family: str) -> dict[str, Any]:
    return json.loads(PP1.read_text())["models"][f"ie-synthetic/{family}"]["points"]


FAMILIES = sorted(_sweep()["families"]) if SWEEP.exists() else []


def test_the_sweep_is_committed() -> None:
    assert "llama" in FAMILIES and len(FAMILIES) >= 2, "run scripts/pipeline_sweep.py"


@pytest.mark.parametrize("family", FAMILIES)
def test_pp2_serves_what_pp1_serves(family: str) -> None:
    got = _sweep()["families"][family]["points"]
    want = {
        name: {k: p[k] for k in ("served", "writable", "layers")}
        for name, p in _pp1(family).items()
    }
    assert got == want


@pytest.mark.parametrize("family", FAMILIES)
def test_pp2_matches_eager_and_splits_the_layers(family: str) -> None:
    entry, tol = _sweep()["families"][family], _sweep()["tolerance"]
    worst = entry["worst_scaled"]
    served = {name for name, p in entry["points"].items() if p["served"]}
    assert set(worst) == served  # every served point was compared
    assert max(worst.values()) <= tol, worst
    assert entry["greedy_equal"]
    (lo0, hi0), (lo1, hi1) = entry["stages"]
    layers = max(max(p["layers"], default=0) for p in entry["points"].values()) + 1
    assert lo0 == 0 and hi0 == lo1 and hi1 == layers


TP2 = sorted(_sweep().get("tp2_families", {})) if SWEEP.exists() else []
SHARDED = "is split across heads or neurons under tensor parallelism"


@pytest.mark.parametrize("family", TP2)
def test_tp2_pp2_serves_pp1_points_but_the_sharded_and_matches_eager(family: str) -> None:
    entry, tol = _sweep()["tp2_families"][family], _sweep()["tolerance"]
    pp1 = {name for name, p in _pp1(family).items() if p["served"]}
    served = {name for name, p in entry["points"].items() if p["served"]}
    assert served <= pp1
    for name in pp1 - served:  # refused only because TP shards it, and said so
        assert SHARDED in entry["refused"][name], (name, entry["refused"][name])
    assert set(entry["worst_scaled"]) == served
    assert max(entry["worst_scaled"].values()) <= tol
    assert entry["greedy_equal"]
    (lo0, hi0), (lo1, _) = entry["stages"]
    assert lo0 == 0 and hi0 == lo1
