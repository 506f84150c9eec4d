"""Model ids the sweep accepts: `ie-synthetic/<family>`, the shipped SmolLM2, a local folder, or
an HF id already in the local Hugging Face cache (nothing is downloaded)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ie_core.errors import ModelNotFoundError
from ie_core.models import SYNTHETIC_PREFIX, resolve_model_path

from ie_validator.engines.base import ModelSpec
from ie_validator.mappings import family_key

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
# The quantized checkpoints with matrix rows: one family, every scheme ie_eager.quantized builds.
QUANTIZED_FAMILY = "llama"


def synthetic_ids() -> list[str]:
    """Every synthetic family the eager package can build."""
    from ie_eager.synthetic import FAMILIES

    return [f"{SYNTHETIC_PREFIX}{slug}" for slug in FAMILIES]


def quantized_ids() -> list[str]:
    """`ie-synthetic/llama-<scheme>` for every scheme the quantizer builds."""
    from ie_eager.quantized import SCHEMES

    return [f"{SYNTHETIC_PREFIX}{QUANTIZED_FAMILY}-{suffix}" for suffix in SCHEMES]


def default_models() -> list[str]:
    return [*synthetic_ids(), SMOLLM2, *quantized_ids()]


def quant_scheme(config: dict[str, Any]) -> str:
    """The checkpoint's quantization as the gates name it: `w8a8`, `w4a16`, `fp8` for
    compressed-tensors (`w<bits>a<bits>` for other widths), the method (`awq`, `gptq`) for other
    formats, empty for a full-precision checkpoint."""
    quant = config.get("quantization_config")
    if not isinstance(quant, dict):
        return ""
    method = str(quant.get("quant_method", "unknown"))
    groups = quant.get("config_groups") or {}
    if method != "compressed-tensors" or not groups:
        return method
    group = next(iter(groups.values()))
    weights, inputs = group.get("weights") or {}, group.get("input_activations") or {}
    if weights.get("type") == "float" and weights.get("num_bits") == 8:
        return "fp8"
    return f"w{weights.get('num_bits')}a{inputs.get('num_bits', 16)}"


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
    return ModelSpec(
        model_id, path, family_key(architecture), architecture, n_layers, quant_scheme(config)
    )
