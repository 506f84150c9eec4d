"""Result files: one JSON per (model, engine) under `validator/results/<model slug>/<engine>.json`.

The record is `ie_core.tooling.records.ValidatorResult`, the one the dashboard ingests, documented in
validator/README.md ("Result schema"); `SCHEMA_VERSION` changes whenever a field changes meaning.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ie_core.tooling.records import VALIDATOR_SCHEMA_VERSION, PointResult, ValidatorResult

SCHEMA_VERSION = VALIDATOR_SCHEMA_VERSION


def default_root() -> Path:
    """The results folder of `ie_validator.layout` (working directory or `$IE_VALIDATOR_ROOT`)."""
    from ie_validator.layout import layout

    return layout().results


def model_slug(hf_id: str) -> str:
    """A folder name for a model id: `ie-synthetic/llama` -> `ie-synthetic__llama`."""
    return hf_id.strip("/").replace("/", "__")


def result_path(hf_id: str, engine: str, root: Path | None = None) -> Path:
    return (root or default_root()) / model_slug(hf_id) / f"{engine}.json"


def write_result(result: ValidatorResult, root: Path | None = None) -> Path:
    """Write one (model, engine) file; every other file under `root` is left as it is."""
    path = result_path(result.hf_id, result.engine, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result.to_json(), indent=1, sort_keys=False) + "\n")
    tmp.replace(path)
    return path


def load_results(root: Path | None = None) -> list[dict[str, Any]]:
    """Every result file under `root`, as plain dicts, sorted by model then engine."""
    folder = root or default_root()
    out = [json.loads(p.read_text()) for p in sorted(folder.glob("*/*.json"))]
    return sorted(out, key=lambda r: (r["hf_id"], r["engine"]))


__all__ = [
    "SCHEMA_VERSION",
    "PointResult",
    "ValidatorResult",
    "load_results",
    "model_slug",
    "result_path",
    "write_result",
]
