"""The atlas's dictionary: read from what `load_sae` / `load_transcoders` read, and checked before
any model loads (finite weights; its point's width and layer against the model's config).

`--dictionary` names a folder `load_sae` reads (SAELens, Gemma Scope, sparsify), one
circuit-tracer per-layer file (`layer_<L>.safetensors`: its transcoder reads `mlp_in.L`), or a
circuit-tracer transcoder folder with `--layer L` (that layer's transcoder of the set).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch

from ie_core.errors import DictionaryFormatError, DictionaryShapeError
from ie_core.experiments.saes import SAE, load_sae
from ie_core.grammar import to_address
from ie_core.grammar.naming import get_point
from ie_core.grammar.points import Width

__all__ = ["check_against_config", "check_finite", "describe", "read_dictionary"]

_LAYER_FILE = re.compile(r"layer_(\d+)\.safetensors$")
_SAE_FILES = ("sae_weights.safetensors", "params.npz", "sae.safetensors")


def read_dictionary(source: str | Path, layer: int | None = None) -> SAE:
    """The dictionary at `source` (see the module doc), checked to hold only finite weights."""
    path = Path(source)
    if not path.exists():
        raise DictionaryFormatError(
            f"dictionary {str(path)!r} does not exist; pass a folder or file"
        )
    if path.is_file():
        m = _LAYER_FILE.search(path.name)
        if m is None:
            raise DictionaryFormatError(
                f"{path} is a file but not a circuit-tracer layer_<L>.safetensors; pass a "
                "dictionary folder (SAELens, Gemma Scope, sparsify) or a layer file"
            )
        from ie_core.circuits.transcoders import read_layer_file

        sae = read_layer_file(path, int(m.group(1)))
    elif any((path / name).exists() for name in _SAE_FILES):
        sae = load_sae(path)
    else:
        if layer is None:
            raise DictionaryFormatError(
                f"{path} holds no single dictionary (no {', '.join(_SAE_FILES)}); for a "
                "circuit-tracer transcoder folder pass --layer L"
            )
        from ie_core.circuits.sources import load_transcoders

        found = load_transcoders(path).transcoders
        if not 0 <= layer < len(found):
            raise DictionaryShapeError(f"{path} holds layers 0..{len(found) - 1}, not {layer}")
        sae = found[layer]
    check_finite(sae)
    return sae


def check_finite(sae: SAE) -> None:
    for name, tensor in sae.weights.items():
        if not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise DictionaryFormatError(
                f"{sae.name or 'the dictionary'}'s {name} holds {bad} NaN or inf value(s); every "
                "activation it encodes would be wrong: fix or re-export the dictionary"
            )


def describe(sae: SAE, source: str | Path | None) -> dict[str, Any]:
    """The manifest's record of the dictionary (its content key decides a resume; a dictionary
    built in memory has no source)."""
    return {
        "source": str(Path(source).resolve()) if source else None,
        "name": sae.name,
        "key": sae.key,
        "address": sae.address,
        "out_address": sae.out_address,
        "d_in": sae.d_in,
        "d_sae": sae.d_sae,
        "activation": sae.meta.activation,
    }


def _config(folder: Path) -> dict[str, Any] | None:
    path = folder / "config.json"
    if not path.is_file():
        return None
    body = json.loads(path.read_text())
    return body.get("text_config") or body


def check_against_config(sae: SAE, model_folder: Path | None) -> None:
    """Refuse, from the model's `config.json` alone, a dictionary whose point is wider or
    narrower than the model's or whose layer it lacks. Only model-wide points (`d_model`) are
    judged here; the rest are checked against the loaded model before any forward."""
    cfg = _config(model_folder) if model_folder is not None else None
    if cfg is None:
        return
    d_model = cfg.get("hidden_size") or cfg.get("n_embd") or cfg.get("d_model")
    layers = cfg.get("num_hidden_layers") or cfg.get("n_layer")
    address = to_address(sae.address)
    if layers is not None and address.layer is not None and address.layer >= int(layers):
        raise DictionaryShapeError(
            f"{sae.name or 'the dictionary'} reads {sae.address}, but the model has {layers} "
            "layers; load the dictionary trained for this model"
        )
    model_wide = get_point(address.name).width is Width.D
    if d_model is not None and model_wide and int(d_model) != sae.d_in:
        raise DictionaryShapeError(
            f"{sae.name or 'the dictionary'} reads {sae.d_in}-wide rows but {sae.address} "
            f"is {d_model} wide on this model (config.json hidden_size); load the "
            "dictionary trained for this model"
        )
