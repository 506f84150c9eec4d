"""Model ids the sweep accepts: `ie-synthetic/<family>`, the shipped SmolLM2, a local folder, or
an HF id already in the local Hugging Face cache (nothing is downloaded)."""

from __future__ import annotations

import json
from pathlib import Path

from ie_core.errors import ModelNotFoundError
from ie_core.models import SYNTHETIC_PREFIX, resolve_model_path

from ie_validator.engines.base import ModelSpec
from ie_validator.mappings import family_key

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"


def synthetic_ids() -> list[str]:
    """Every synthetic family the eager package can build."""
    from ie_eager.synthetic import FAMILIES

    return [f"{SYNTHETIC_PREFIX}{slug}" for slug in FAMILIES]


def default_models() -> list[str]:
    return [*synthetic_ids(), SMOLLM2]


def _hf_cache_folder(model_id: str) -> Path | None:
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model_id, local_files_only=True))
    except Exception:
        return None


def _synthetic_fallback(model_id: str) -> Path | None:
    """Build a synthetic family directly when ie-eager does not register its model source."""
    try:
        from ie_eager.synthetic import source
    except ImportError:
        return None
    return source(model_id)


def resolve_folder(model_id: str) -> Path:
    try:
        path = resolve_model_path(model_id)
    except ModelNotFoundError:
        if not model_id.startswith(SYNTHETIC_PREFIX):
            raise
        path = _synthetic_fallback(model_id)
    if path is None:
        path = _hf_cache_folder(model_id)
    if path is None:
        raise ModelNotFoundError(
            f"{model_id!r} is neither a local folder, a synthetic or shipped id, nor in the local "
            "Hugging Face cache; the validator downloads nothing"
        )
    return path


def model_spec(model_id: str) -> ModelSpec:
    path = resolve_folder(model_id)
    config = json.loads((path / "config.json").read_text())
    text = config.get("text_config", config)
    architecture = (config.get("architectures") or ["?"])[0]
    n_layers = next(
        int(text[k]) for k in ("num_hidden_layers", "n_layer", "num_layers") if k in text
    )
    return ModelSpec(model_id, path, family_key(architecture), architecture, n_layers)
