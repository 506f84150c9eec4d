"""Where a transcoder set comes from: a circuit-tracer folder (per-layer `layer_<L>.safetensors`
or a cross-layer `W_enc_<L>` / `W_dec_<L>` set, with an optional `config.yaml`), or a list (or
layer -> item mapping) of transcoders `load_sae` reads. The formats themselves live in
`transcoders.py` (per-layer) and `clt.py` (cross-layer).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ie_core.circuits.clt import read_clt
from ie_core.circuits.errors import TranscoderFormatError, TranscoderLayerError
from ie_core.circuits.transcoders import TranscoderSet, missing_layers, read_layer_file
from ie_core.experiments.saes import SAE, load_sae

# The TransformerLens hooks circuit-tracer's configs name for a per-layer transcoder's input
# (the MLP's normed input) and output (the MLP's output).
_INPUT_HOOKS = ("mlp.hook_in", "ln2.hook_normalized", "ln2.hook_out")
_OUTPUT_HOOKS = ("mlp.hook_out", "hook_mlp_out")
_LAYER_FILE = re.compile(r"layer_(\d+)\.safetensors$")
_KINDS = ("transcoder_set", "cross_layer_transcoder")


def _config(folder: Path) -> dict[str, Any]:
    cfg_path = folder / "config.yaml"
    if not cfg_path.exists():
        return {}
    import yaml

    cfg = yaml.safe_load(cfg_path.read_text()) or {}
    kind = cfg.get("model_kind", "transcoder_set")
    if kind not in _KINDS:
        raise TranscoderFormatError(
            f"{cfg_path} is a {kind!r}; circuit-tracer's kinds traced here are "
            f"{', '.join(map(repr, _KINDS))}"
        )
    for key, allowed in (
        ("feature_input_hook", _INPUT_HOOKS),
        ("feature_output_hook", _OUTPUT_HOOKS),
    ):
        hook = cfg.get(key)
        if hook is not None and hook not in allowed:
            raise TranscoderFormatError(
                f"{cfg_path}: {key} {hook!r} is not one of {', '.join(allowed)}; a set here "
                "reads the MLP's normed input and writes the MLP's output"
            )
    return cfg


def _layer_paths(folder: Path, cfg: Mapping[str, Any]) -> list[Path]:
    listed = cfg.get("transcoders")
    if listed:
        paths = [Path(str(p).removeprefix("file://")) for p in listed]
        if any(str(p).startswith("hf://") for p in listed):
            raise TranscoderFormatError(
                f"{folder}/config.yaml lists hf:// paths; download them and list local files"
            )
        return [p if p.is_absolute() else folder / p for p in paths]
    found = {int(m.group(1)): p for p in folder.iterdir() if (m := _LAYER_FILE.search(p.name))}
    if not found:
        raise TranscoderFormatError(
            f"{folder} holds no layer_<L>.safetensors files (circuit-tracer's per-layer format)"
        )
    if sorted(found) != list(range(len(found))):
        raise TranscoderLayerError(missing_layers(sorted(found), len(found)))
    return [found[layer] for layer in range(len(found))]


def load_transcoders(
    source: str | Path | TranscoderSet | Sequence[Any] | Mapping[int, Any],
    *,
    scan: str = "",
) -> TranscoderSet:
    """A per-layer set from a circuit-tracer folder, or from a list (or layer -> item mapping) of
    `SAE`s or folders `load_sae` reads (SAELens, Gemma Scope, sparsify transcoders); a
    cross-layer transcoder from a circuit-tracer CLT folder (`W_enc_<L>` / `W_dec_<L>` files)."""
    if isinstance(source, TranscoderSet):
        return source
    if isinstance(source, Mapping):
        return TranscoderSet.of({int(k): _one(v, int(k)) for k, v in source.items()}, scan)
    if isinstance(source, Sequence) and not isinstance(source, str):
        return TranscoderSet.of([_one(v, layer) for layer, v in enumerate(source)], scan)
    folder = Path(source)
    if not folder.is_dir():
        raise TranscoderFormatError(
            f"{source} is not a folder; pass a circuit-tracer transcoder folder (layer_<L>."
            "safetensors or W_enc_<L> / W_dec_<L>.safetensors files) or a list of transcoders"
        )
    cfg = _config(folder)
    if (
        cfg.get("model_kind") == "cross_layer_transcoder"
        or (folder / "W_enc_0.safetensors").is_file()
    ):
        return read_clt(folder, scan or str(cfg.get("scan") or folder.name))
    paths = _layer_paths(folder, cfg)
    layers = [read_layer_file(p, layer) for layer, p in enumerate(paths)]
    return TranscoderSet(tuple(layers), scan or str(cfg.get("scan") or folder.name))


def _one(item: Any, layer: int) -> SAE:
    if isinstance(item, SAE):
        return item
    path = Path(item)
    if path.is_file():
        return read_layer_file(path, layer)
    return load_sae(path)  # the set checks it reads mlp_in.L and writes mlp_out.L


__all__ = ["load_transcoders"]
