"""`ie-synthetic/<family>-<scheme>`: a synthetic family's weights quantized offline, in
compressed-tensors format.

A quantized checkpoint is a variant of a family (the same architecture, config and points), not a
family of its own: it is made from the family's built folder by quantizing every decoder linear
weight with compressed-tensors' own scale maths and compressors (the format vLLM and transformers
read), leaving embeddings, norms and the unembed in float32. Scales come from each weight's own
min/max (no calibration data), so the build is deterministic: the same family and scheme give the
same bytes in every process.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from ie_core.errors import ModelNotFoundError
from safetensors.torch import load_file, save_file

from ie_eager._hf_folder import materialize

__all__ = [
    "QUANT_VERSION",
    "SCHEMES",
    "QuantScheme",
    "QuantizationUnavailableError",
    "build_variant",
    "split_variant",
    "variant_dir",
]

# Bump when the quantizer changes, so old cached folders are not reused.
QUANT_VERSION = "q1"

# Families whose decoder linears are plain `*_proj` modules of widths the CPU kernels take
# (multiples of 32); other families are refused rather than quantized half way.
QUANTIZABLE_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "granite")

_LINEAR = re.compile(r"^model\.layers\.\d+\.(self_attn|mlp)\.[a-z_]+_proj\.weight$")
_WEIGHTS = "model.safetensors"
_COPIED = ("tokenizer.json", "tokenizer_config.json", "generation_config.json",
           "special_tokens_map.json", "chat_template.jinja")  # fmt: skip


class QuantizationUnavailableError(ModelNotFoundError):
    """A quantized variant cannot be built: compressed-tensors is missing, or the family is not
    one the quantizer handles."""


@dataclass(frozen=True)
class QuantScheme:
    """One quantization: compressed-tensors' preset, the storage format, and what it means."""

    suffix: str  # the `-<suffix>` of the model id
    preset: str  # compressed-tensors preset scheme name
    format: str  # compressed-tensors storage format
    description: str


SCHEMES: Mapping[str, QuantScheme] = {
    s.suffix: s
    for s in (
        QuantScheme("w8a8", "W8A8", "int-quantized",
                    "INT8 weights per output channel, INT8 activations per token (dynamic)"),
        QuantScheme("w4a16", "W4A16", "pack-quantized",
                    "4-bit symmetric weights in groups of 128, activations in float32"),
        QuantScheme("fp8", "FP8_DYNAMIC", "float-quantized",
                    "FP8 e4m3 weights per output channel, FP8 activations per token (dynamic)"),
    )
}  # fmt: skip


def split_variant(name: str) -> tuple[str, QuantScheme | None]:
    """`llama-w8a8` -> (`llama`, the w8a8 scheme); a plain family name -> (name, None)."""
    for suffix, scheme in SCHEMES.items():
        if name.endswith(f"-{suffix}"):
            return name.removesuffix(f"-{suffix}"), scheme
    return name, None


def variant_dir(base: Path, scheme: QuantScheme) -> Path:
    """The cache folder of a family's quantized variant, beside the family's own folder."""
    return base.with_name(f"{base.name}-{scheme.suffix}-{QUANT_VERSION}")


def build_variant(family: str, base: Path, scheme: QuantScheme) -> Path:
    """Build the `scheme` variant of `family` (built in `base`) once, atomically; its folder."""
    if family not in QUANTIZABLE_FAMILIES:
        raise QuantizationUnavailableError(
            f"no quantized variant of ie-synthetic/{family}: the quantizer handles "
            f"{', '.join(QUANTIZABLE_FAMILIES)} (plain *_proj decoder linears)"
        )
    _require_compressed_tensors()
    return materialize(variant_dir(base, scheme), lambda out: _write_variant(base, scheme, out))


def _require_compressed_tensors() -> None:
    try:
        import compressed_tensors  # noqa: F401
    except ImportError:
        raise QuantizationUnavailableError(
            "quantized synthetic checkpoints are written and read with compressed-tensors, "
            "which is not installed; run `pip install 'ie-eager[quant]'`"
        ) from None


def _write_variant(base: Path, scheme: QuantScheme, out: Path) -> None:
    from compressed_tensors.quantization import preset_name_to_scheme

    ct_scheme = preset_name_to_scheme(scheme.preset, ["Linear"])
    state = load_file(base / _WEIGHTS)
    quantized: dict[str, torch.Tensor] = {}
    for name in sorted(state):
        tensor = state[name]
        if _LINEAR.match(name):
            prefix = name.removesuffix("weight")
            for key, value in _compress(tensor, ct_scheme, scheme.format).items():
                quantized[prefix + key] = value.contiguous()
        else:
            quantized[name] = tensor.contiguous()
    save_file(quantized, str(out / _WEIGHTS), metadata={"format": "pt"})
    config = json.loads((base / "config.json").read_text())
    config["quantization_config"] = _quant_config(ct_scheme, scheme.format)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    for file in _COPIED:
        if (base / file).is_file():
            shutil.copyfile(base / file, out / file)


def _compress(weight: torch.Tensor, ct_scheme: Any, fmt: str) -> dict[str, torch.Tensor]:
    """One linear's compressed tensors (`weight` or `weight_packed`, `weight_scale`, ...)."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization.utils import calculate_qparams

    args = ct_scheme.weights
    if args.group_size:
        grouped = weight.reshape(weight.shape[0], -1, args.group_size)
        low, high = grouped.amin(dim=-1), grouped.amax(dim=-1)
    else:
        low, high = weight.amin(dim=1, keepdim=True), weight.amax(dim=1, keepdim=True)
    scale, zero_point = calculate_qparams(low, high, args)
    module_state: dict[str, torch.Tensor | None] = {
        "weight": weight,
        "weight_scale": scale.to(weight.dtype),
    }
    if not args.symmetric:
        module_state["weight_zero_point"] = zero_point
    compressor = BaseCompressor.get_value_from_registry(fmt)
    out = compressor.compress(module_state, ct_scheme)
    return {key: value for key, value in out.items() if value is not None}


def _quant_config(ct_scheme: Any, fmt: str) -> dict[str, Any]:
    from compressed_tensors.quantization import QuantizationConfig, QuantizationStatus

    config = QuantizationConfig(
        config_groups={"group_0": ct_scheme},
        format=fmt,
        quantization_status=QuantizationStatus.COMPRESSED,
        ignore=["lm_head"],
    )
    return json.loads(config.model_dump_json())
