"""Per-layer transcoder sets: one transcoder per decoder layer, reading `mlp_in.L` (the MLP's
normed input) and writing `mlp_out.L`, checked against a model before any work.

circuit-tracer's on-disk format (0.5.0, `transcoder/single_layer_transcoder.py`): a folder of
`layer_{L}.safetensors` files, optionally with a `config.yaml` (`model_kind: transcoder_set`,
`feature_input_hook`, `feature_output_hook`, `transcoders`: one path per layer in layer order).
Each file holds `W_enc` and `W_dec` as `[d_transcoder, d_model]`, `b_enc` `[d_transcoder]`,
`b_dec` `[d_model]`, and `activation_function.threshold` `[d_transcoder]` for JumpReLU (ReLU
without it); a `W_skip` skip connection is refused here. SAELens, Gemma Scope and sparsify
transcoders load through `ie_core.experiments.saes.load_sae` and join a set with `TranscoderSet.of`.
Cross-layer transcoders (`model_kind: cross_layer_transcoder`) are read by `clt.py`; `sources.py`
picks the reader for a folder or list.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ie_core.circuits.errors import (
    TranscoderFormatError,
    TranscoderLayerError,
    TranscoderWidthError,
)
from ie_core.experiments.saes import SAE, from_tensors


@dataclass(frozen=True)
class TranscoderSet:
    """One transcoder per layer, `transcoders[L]` reading `mlp_in.L` and writing `mlp_out.L`.

    A cross-layer transcoder (CLT) is a set whose `cross_decoders[L]` `[d_transcoder, n_layers -
    L, d_model]` decode layer L's features into `mlp_out.L`, `mlp_out.L+1`, ... (its encoders,
    biases and thresholds are the per-layer SAEs'; `b_dec` of SAE L is the CLT's bias at L)."""

    transcoders: tuple[SAE, ...]
    scan: str = ""
    cross_decoders: tuple[torch.Tensor, ...] = ()

    def __post_init__(self) -> None:
        if not self.transcoders:
            raise TranscoderLayerError("a transcoder set needs at least one transcoder")
        if self.cross_decoders:
            _check_cross(self.transcoders, self.cross_decoders)
        for layer, tc in enumerate(self.transcoders):
            want = (f"mlp_in.{layer}", f"mlp_out.{layer}")
            if (tc.address, tc.out_address) != want:
                raise TranscoderLayerError(
                    f"transcoder {layer} reads {tc.address} and writes {tc.out_address}; a "
                    f"per-layer set's transcoder {layer} reads {want[0]} and writes {want[1]}"
                )
            if tc.meta.normalize != "none" or tc.meta.b_dec_in:
                raise TranscoderFormatError(
                    f"transcoder {layer} normalises or shifts its input first, which is not "
                    "linear in the residual; fold it into W_enc / b_enc"
                )

    @classmethod
    def of(cls, transcoders: Sequence[SAE] | Mapping[int, SAE], scan: str = "") -> TranscoderSet:
        """A set from loaded dictionaries, in layer order (a mapping: layer -> transcoder)."""
        if isinstance(transcoders, Mapping):
            layers = sorted(transcoders)
            if layers != list(range(len(layers))):
                raise TranscoderLayerError(missing_layers(layers, len(layers)))
            transcoders = [transcoders[layer] for layer in layers]
        return cls(tuple(transcoders), scan)

    @property
    def n_layers(self) -> int:
        return len(self.transcoders)

    @property
    def is_cross_layer(self) -> bool:
        return bool(self.cross_decoders)

    def decoders(self, layer: int) -> torch.Tensor:
        """Layer `layer`'s decoders `[d_transcoder, n_writes, d_model]`: to `mlp_out.layer` and,
        for a CLT, to every later layer's `mlp_out` in order."""
        if self.cross_decoders:
            return self.cross_decoders[layer]
        return self.transcoders[layer].weights["W_dec"][:, None]

    def check(self, n_layers: int, d_model: int) -> None:
        """Refuse a set that does not cover exactly the model's layers or has wrong widths."""
        if self.n_layers != n_layers:
            raise TranscoderLayerError(
                f"the set has transcoders for layers 0..{self.n_layers - 1} but the model has "
                f"{n_layers} layers; per-layer attribution needs one transcoder per layer"
            )
        for layer, tc in enumerate(self.transcoders):
            d_dec = self.decoders(layer).shape[-1]
            if tc.d_in != d_model or tc.d_out != d_model or d_dec != d_model:
                raise TranscoderWidthError(
                    f"transcoder {layer} maps {tc.d_in} -> {d_dec} wide rows but the model's "
                    f"d_model is {d_model}: it was trained for another model"
                )


def _check_cross(saes: Sequence[SAE], decoders: Sequence[torch.Tensor]) -> None:
    """A CLT's decoders: one per source layer, each to that layer and every later one."""
    n = len(saes)
    if len(decoders) != n:
        raise TranscoderLayerError(
            f"the cross-layer transcoder has {len(decoders)} decoder tensors for {n} layers"
        )
    for layer, (tc, dec) in enumerate(zip(saes, decoders, strict=True)):
        want = (tc.d_sae, n - layer, tc.d_out)
        if tuple(dec.shape) != want:
            raise TranscoderWidthError(
                f"cross-layer decoder {layer} is {tuple(dec.shape)}; it should be [d_transcoder, "
                f"n_layers - {layer}, d_model] = {list(want)} (circuit-tracer's W_dec_{layer})"
            )


def missing_layers(layers: Sequence[int], n: int) -> str:
    absent = sorted(set(range(max(layers, default=-1) + 1)) - set(layers))
    return (
        f"the set misses layer(s) {absent or list(range(n))}: per-layer attribution needs one "
        "transcoder for every layer 0..n_layers-1"
    )


def read_layer_file(path: Path, layer: int) -> SAE:
    """One circuit-tracer per-layer transcoder file, as an `SAE` reading mlp_in.L."""
    from safetensors.torch import load_file

    raw = load_file(str(path))
    missing = [k for k in ("W_enc", "W_dec", "b_enc", "b_dec") if k not in raw]
    if missing:
        raise TranscoderFormatError(f"{path} has no {', '.join(missing)} tensor")
    if raw.get("W_skip") is not None:
        raise TranscoderFormatError(
            f"{path} has a skip connection (W_skip); graphs through skip transcoders are not "
            "built here yet: use a transcoder without one"
        )
    enc, dec = raw["W_enc"], raw["W_dec"]
    if enc.dim() != 2 or tuple(enc.shape) != tuple(dec.shape):
        raise TranscoderFormatError(
            f"{path}: W_enc {tuple(enc.shape)} and W_dec {tuple(dec.shape)} must both be "
            "[d_transcoder, d_model] (circuit-tracer's layout)"
        )
    weights: dict[str, Any] = {
        "W_enc": enc.T.contiguous(),
        "W_dec": dec,
        "b_enc": raw["b_enc"],
        "b_dec": raw["b_dec"],
    }
    threshold = raw.get("activation_function.threshold")
    if threshold is not None:
        weights["threshold"] = threshold.expand(enc.shape[0]).contiguous()
    return from_tensors(
        weights,
        address=f"mlp_in.{layer}",
        out_address=f"mlp_out.{layer}",
        activation="jumprelu" if threshold is not None else "relu",
        name=path.name,
    )


def write_layer_file(sae: SAE, path: Path) -> None:
    """Save one transcoder in circuit-tracer's per-layer layout (tests and parity scripts)."""
    from safetensors.torch import save_file

    w = sae.weights
    out = {
        "W_enc": w["W_enc"].T.contiguous(),
        "W_dec": w["W_dec"].contiguous(),
        "b_enc": w["b_enc"].contiguous(),
        "b_dec": w["b_dec"].contiguous(),
    }
    if sae.meta.activation == "jumprelu":
        out["activation_function.threshold"] = w["threshold"].contiguous()
    elif sae.meta.activation != "relu":
        raise TranscoderFormatError(
            f"circuit-tracer's per-layer files hold ReLU or JumpReLU transcoders, not "
            f"{sae.meta.activation}"
        )
    save_file(out, str(path))


def random_transcoder(
    d_model: int, d_transcoder: int, layer: int, *, seed: int, activation: str = "relu"
) -> SAE:
    """A seeded random-weight transcoder (tests and parity records), with b_enc set so that
    some but not all features fire on rows of unit scale."""
    g = torch.Generator().manual_seed(seed)
    w: dict[str, torch.Tensor] = {
        "W_enc": torch.randn(d_model, d_transcoder, generator=g) / d_model**0.5,
        "W_dec": torch.randn(d_transcoder, d_model, generator=g) / d_transcoder**0.5,
        "b_enc": torch.randn(d_transcoder, generator=g) * 0.1 - 0.2,
        "b_dec": torch.randn(d_model, generator=g) * 0.01,
    }
    if activation == "jumprelu":
        w["threshold"] = torch.rand(d_transcoder, generator=g) * 0.1
    return from_tensors(
        w, address=f"mlp_in.{layer}", out_address=f"mlp_out.{layer}", activation=activation
    )


__all__ = [
    "TranscoderSet",
    "missing_layers",
    "random_transcoder",
    "read_layer_file",
    "write_layer_file",
]
