"""Result files: one JSON per (model, engine) under `validator/results/<model slug>/<engine>.json`.

The field list is documented in validator/README.md ("Result schema"); the dashboard ingests these
files, so `SCHEMA_VERSION` changes whenever a field changes meaning.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1


def default_root() -> Path:
    """The results folder of `ie_validator.layout` (working directory or `$IE_VALIDATOR_ROOT`)."""
    from ie_validator.layout import layout

    return layout().results


@dataclass(frozen=True)
class PointResult:
    point: str
    layer: int | None
    address: str
    tier: str
    status: str  # pass | warn | fail | n/a
    cos: float | None = None
    max_abs_diff: float | None = None
    rel_diff: float | None = None
    worst_token: int | None = None
    worst_token_max_abs_diff: float | None = None
    worst_token_cos: float | None = None
    reason: str = ""
    engine_hook: str = ""
    shape: list[int] | None = None


@dataclass(frozen=True)
class EngineResult:
    hf_id: str
    engine: str
    reference: str
    verdict: str  # pass | warn | fail | unsupported
    status: str  # ok | engine_error | reference_error
    captured_at: str
    dtype: str
    device: str
    family: str
    architecture: str
    tier: str
    prompt: str
    token_ids: list[int]
    layers: list[int]
    versions: dict[str, str]
    summary: dict[str, int]
    points: list[PointResult] = field(default_factory=list)
    error: str = ""
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def model_slug(hf_id: str) -> str:
    """A folder name for a model id: `ie-synthetic/llama` -> `ie-synthetic__llama`."""
    return hf_id.strip("/").replace("/", "__")


def result_path(hf_id: str, engine: str, root: Path | None = None) -> Path:
    return (root or default_root()) / model_slug(hf_id) / f"{engine}.json"


def write_result(result: EngineResult, root: Path | None = None) -> Path:
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
