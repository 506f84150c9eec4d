"""docs/examples/atlas_smollm2.py: the node it picks and its refusal without the first example's
folder (the run itself is the worked example's: minutes of SmolLM2; see docs/USAGE.md)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "docs" / "examples" / "atlas_smollm2.py"


def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("atlas_smollm2", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_it_picks_the_most_influential_feature_not_an_error_or_logit() -> None:
    def node(nid: str, kind: str, influence: float | None) -> dict[str, object]:
        return {"node_id": nid, "feature_type": kind, "influence": influence, "layer": nid[:2]}

    graph = {"nodes": [node("29_493_5", "cross layer transcoder", 0.02),
                       node("0_3_5", "mlp reconstruction error", 0.001),
                       node("12_7_3", "cross layer transcoder", 0.01),
                       node("31_6342_5", "logit", None)]}  # fmt: skip
    assert example().top_feature(graph)["node_id"] == "12_7_3"


def test_without_the_transcoder_example_it_says_what_to_run(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"transcoders_smollm2\.py --out"):
        example().main(["--out", str(tmp_path)])
