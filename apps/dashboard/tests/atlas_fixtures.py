"""A synthetic atlas folder for the dashboard's atlas tests: ie-core's `atlas_synthetic.py`
(loaded by path: test helper folders are not packages) at 16,384 features, its transcoder set
named `SCAN` (a config.yaml beside a layer file, as circuit-tracer's folders carry)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

D_SAE = 16_384
SCAN = "synthetic-transcoders"
_HELPER = Path(__file__).resolve().parents[3] / "packages/ie-core/tests/atlas_synthetic.py"


def _helper() -> Any:
    if "atlas_synthetic" not in sys.modules:
        spec = importlib.util.spec_from_file_location("atlas_synthetic", _HELPER)
        assert spec is not None and spec.loader is not None
        sys.modules["atlas_synthetic"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["atlas_synthetic"])
    return sys.modules["atlas_synthetic"]


def decode(token: int) -> str:
    """A stand-in tokenizer: ids as words, some with a leading space, one a line break."""
    return "\n" if token == 0 else (" " if token % 3 else "") + f"w{token}"


def synthetic_atlas(folder: Path, d_sae: int = D_SAE, **options: Any) -> Any:
    transcoders = folder.parent / "transcoders"
    transcoders.mkdir(parents=True, exist_ok=True)
    (transcoders / "config.yaml").write_text(f"model_kind: transcoder_set\nscan: {SCAN}\n")
    layer = transcoders / "layer_5.safetensors"
    layer.touch()
    return _helper().write_synthetic_atlas(folder, d_sae=d_sae, source=str(layer), **options)
