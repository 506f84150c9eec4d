"""Cross-layer transcoders (CLTs, Ameisen et al. 2025) in circuit-tracer's format: features
encoded at layer L from `mlp_in.L`, each decoded into `mlp_out.L` and every later `mlp_out`.

circuit-tracer's on-disk format (0.5.0, `transcoder/cross_layer_transcoder.py`, `load_clt`): a
folder, optionally with a `config.yaml` (`model_kind: cross_layer_transcoder`,
`feature_input_hook`, `feature_output_hook`), holding per layer L `W_enc_{L}.safetensors` with
`W_enc_{L}` `[d_transcoder, d_model]`, `b_enc_{L}` `[d_transcoder]`, `b_dec_{L}` `[d_model]` and,
for JumpReLU, `threshold_{L}` `[d_transcoder]` (ReLU without it), and `W_dec_{L}.safetensors` with
`W_dec_{L}` `[d_transcoder, n_layers - L, d_model]` (to layers L, L+1, ..., n_layers - 1).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import torch

from ie_core.circuits.errors import TranscoderFormatError, TranscoderLayerError
from ie_core.circuits.transcoders import TranscoderSet, random_transcoder
from ie_core.experiments.saes import SAE, from_tensors

_ENC_FILE = re.compile(r"W_enc_(\d+)\.safetensors$")


def cross_layer_set(
    encoders: Sequence[SAE], decoders: Sequence[torch.Tensor], scan: str = ""
) -> TranscoderSet:
    """A CLT from per-layer encoders (`SAE`s reading `mlp_in.L`; their `b_dec` is the CLT's bias
    at `mlp_out.L`) and decoders `[d_transcoder, n_layers - L, d_model]`; each SAE's own `W_dec`
    is replaced by its decoder to its own layer."""
    saes = []
    for tc, dec in zip(encoders, decoders, strict=True):
        if dec.dim() != 3:
            raise TranscoderFormatError(
                f"a cross-layer decoder is [d_transcoder, n_writes, d_model], not {tuple(dec.shape)}"
            )
        w = dict(tc.weights) | {"W_dec": dec[:, 0]}
        meta = {"activation": tc.meta.activation, "k": tc.meta.k, "name": tc.name}
        saes.append(from_tensors(w, address=tc.address, out_address=tc.out_address, **meta))
    return TranscoderSet(tuple(saes), scan, tuple(decoders))


def _layers(folder: Path) -> int:
    found = sorted(int(m.group(1)) for p in folder.iterdir() if (m := _ENC_FILE.search(p.name)))
    if not found:
        raise TranscoderFormatError(
            f"{folder} holds no W_enc_<L>.safetensors files (circuit-tracer's CLT format)"
        )
    if found != list(range(len(found))):
        absent = sorted(set(range(found[-1] + 1)) - set(found))
        raise TranscoderLayerError(f"the CLT in {folder} misses encoder layer(s) {absent}")
    return len(found)


def _tensors(path: Path, names: Sequence[str]) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    if not path.is_file():
        raise TranscoderFormatError(f"{path} is missing (circuit-tracer's CLT keeps one per layer)")
    raw = load_file(str(path))
    if any(k.startswith("W_skip") for k in raw):
        raise TranscoderFormatError(
            f"{path} has a skip connection (W_skip); graphs through skip transcoders are not "
            "built here yet"
        )
    missing = [n for n in names if n not in raw]
    if missing:
        raise TranscoderFormatError(f"{path} has no {', '.join(missing)} tensor")
    return raw


def _encoder(folder: Path, layer: int, dec: torch.Tensor) -> SAE:
    """Layer `layer`'s encoder, biases and threshold, with its decoder to its own layer, as an
    `SAE` (the set checks `dec`'s shape before this reads it)."""
    names = [f"{n}_{layer}" for n in ("W_enc", "b_enc", "b_dec")]
    raw = _tensors(folder / f"W_enc_{layer}.safetensors", names)
    enc, b_enc, b_dec = (raw[n] for n in names)
    if enc.dim() != 2 or tuple(b_enc.shape) != (enc.shape[0],) or b_dec.dim() != 1:
        raise TranscoderFormatError(
            f"W_enc_{layer} {tuple(enc.shape)}, b_enc_{layer} {tuple(b_enc.shape)}, b_dec_{layer} "
            f"{tuple(b_dec.shape)}: circuit-tracer's layout is [d_transcoder, d_model], "
            "[d_transcoder], [d_model]"
        )
    if dec.dim() != 3 or dec.shape[0] != enc.shape[0] or dec.shape[1] < 1:
        raise TranscoderFormatError(
            f"W_dec_{layer} is {tuple(dec.shape)}; circuit-tracer's layout is [d_transcoder, "
            f"n_layers - {layer}, d_model] with d_transcoder {enc.shape[0]} as W_enc_{layer}'s"
        )
    w = {"W_enc": enc.T.contiguous(), "W_dec": dec[:, 0], "b_enc": b_enc, "b_dec": b_dec}
    threshold = raw.get(f"threshold_{layer}")
    if threshold is not None:
        w["threshold"] = threshold.reshape(-1).expand(enc.shape[0]).contiguous()
    return from_tensors(
        w, address=f"mlp_in.{layer}", out_address=f"mlp_out.{layer}",
        activation="jumprelu" if threshold is not None else "relu", name=f"W_enc_{layer}",
    )  # fmt: skip


def read_clt(folder: Path, scan: str = "") -> TranscoderSet:
    """A circuit-tracer CLT folder as a cross-layer `TranscoderSet` (fp32 kept as stored)."""
    n = _layers(folder)
    decoders = [
        _tensors(folder / f"W_dec_{layer}.safetensors", [f"W_dec_{layer}"])[f"W_dec_{layer}"]
        for layer in range(n)
    ]
    encoders = [_encoder(folder, layer, dec) for layer, dec in enumerate(decoders)]
    return TranscoderSet(tuple(encoders), scan or folder.name, tuple(decoders))


def write_clt(ts: TranscoderSet, folder: Path) -> None:
    """Save a CLT in circuit-tracer's layout (tests and parity scripts)."""
    from safetensors.torch import save_file

    if not ts.is_cross_layer:
        raise TranscoderFormatError("write_clt writes cross-layer sets; use write_layer_file")
    folder.mkdir(parents=True, exist_ok=True)
    for layer, tc in enumerate(ts.transcoders):
        w = tc.weights
        enc = {
            f"W_enc_{layer}": w["W_enc"].T.contiguous(),
            f"b_enc_{layer}": w["b_enc"].contiguous(),
            f"b_dec_{layer}": w["b_dec"].contiguous(),
        }
        if tc.meta.activation == "jumprelu":
            enc[f"threshold_{layer}"] = w["threshold"].contiguous()
        elif tc.meta.activation != "relu":
            raise TranscoderFormatError(
                f"circuit-tracer's CLT files hold ReLU or JumpReLU features, not "
                f"{tc.meta.activation}"
            )
        save_file(enc, str(folder / f"W_enc_{layer}.safetensors"))
        dec = {f"W_dec_{layer}": ts.decoders(layer).contiguous()}
        save_file(dec, str(folder / f"W_dec_{layer}.safetensors"))


def random_clt(
    d_model: int, d_transcoder: int, n_layers: int, *, seed: int, activation: str = "relu",
    k: int | None = None,
) -> TranscoderSet:  # fmt: skip
    """A seeded random-weight CLT (tests and parity records): encoders as `random_transcoder`'s,
    decoders scaled down by the number of layers each output sums over."""
    encoders, decoders = [], []
    g = torch.Generator().manual_seed(seed)
    for layer in range(n_layers):
        base = "relu" if activation == "topk" else activation
        tc = random_transcoder(d_model, d_transcoder, layer, seed=seed + 1 + layer,
                               activation=base)  # fmt: skip
        if activation == "topk":
            tc = from_tensors(tc.weights, address=tc.address, out_address=tc.out_address,
                              activation=activation, k=k)  # fmt: skip
        dec = torch.randn(d_transcoder, n_layers - layer, d_model, generator=g)
        encoders.append(tc)
        decoders.append(dec / (d_transcoder * n_layers) ** 0.5)
    return cross_layer_set(encoders, decoders, scan=f"random-clt-{seed}")


__all__ = ["cross_layer_set", "random_clt", "read_clt", "write_clt"]
