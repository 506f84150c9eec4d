"""A finished atlas folder without a model: random sparse activations of `d_sae` features over
random token windows, reduced by the real state (`from_rows`) and written in the real layout
(`storage.py`), each kept context's per-token activations taken from the same rows. For readers
of the folder (the dashboard's import, the delphi export) at widths a model run would take
minutes to reach; `rows` returns the activations so a test can compute what a reader must show.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch
from ie_core.atlas.state import AtlasState, Binning, from_rows
from ie_core.atlas.storage import (
    CONTEXTS,
    LOGITS,
    AtlasManifest,
    Checkpoint,
    write_checkpoint,
    write_manifest,
    write_tensors,
)


@dataclass(frozen=True)
class Synthetic:
    folder: Path
    acts: torch.Tensor  # [windows, context, d_sae]
    tokens: torch.Tensor  # [windows, context]
    state: AtlasState


def _contexts(
    state: AtlasState, acts: torch.Tensor, tokens: torch.Tensor
) -> dict[str, torch.Tensor]:
    d = state.d_sae
    feature_top = torch.arange(d).view(d, 1).expand_as(state.top_sequence)
    top = acts[state.top_sequence.clamp_min(0), :, feature_top]  # [d, k, context]
    top[state.top_sequence < 0] = 0
    feature_band = torch.arange(d).view(d, 1, 1).expand_as(state.sample_sequence)
    sample = acts[state.sample_sequence.clamp_min(0), :, feature_band]
    sample[state.sample_sequence < 0] = 0
    kept = torch.cat([state.top_sequence.flatten(), state.sample_sequence.flatten()])
    windows = kept[kept >= 0].unique()
    return {"top_acts": top.contiguous(), "sample_acts": sample.contiguous(),
            "window_tokens": tokens[windows].contiguous(), "window_sequence": windows}  # fmt: skip


def write_synthetic_atlas(
    folder: Path, *, d_sae: int, windows: int = 24, context: int = 16, k: int = 4,
    samples: int = 1, vocab: int = 300, fire: float = 0.03, seed: int = 0,
    model: str = "ie-synthetic/llama", address: str = "mlp_in.5", source: str | None = None,
) -> Synthetic:  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (windows, context), generator=g)
    mask = torch.rand(windows, context, d_sae, generator=g) < fire
    acts = torch.rand(windows, context, d_sae, generator=g).mul_(6).exp2_().div_(8) * mask
    sequence = torch.arange(windows).repeat_interleave(context)
    position = torch.arange(context).repeat(windows)
    empty = AtlasState.empty(d_sae, k, samples, Binning(per_octave=2, low=-4, high=4))
    state = from_rows(empty, acts.reshape(-1, d_sae), sequence, position)
    folder.mkdir(parents=True, exist_ok=True)
    write_checkpoint(folder, Checkpoint(state, windows, hashlib.sha256(tokens.numpy()).hexdigest()))
    write_tensors(folder / CONTEXTS, _contexts(state, acts, tokens), {})
    ids = torch.randint(0, vocab, (d_sae, 2, 3), generator=g)
    values = torch.randn(d_sae, 2, 3, generator=g).abs().sort(dim=-1, descending=True).values
    logits = {"top_ids": ids[:, 0], "top_values": values[:, 0],
              "bottom_ids": ids[:, 1], "bottom_values": -values[:, 1]}  # fmt: skip
    write_tensors(folder / LOGITS, logits, {})
    dictionary = {"source": source, "name": f"synthetic-{d_sae}", "key": f"synthetic-{seed}",
                  "address": address, "out_address": address.replace("_in", "_out"),
                  "d_in": 8, "d_sae": d_sae, "activation": "relu"}  # fmt: skip
    spec = {"model": model, "context": context, "top_k": k, "samples": samples,
            "dictionary": dictionary, "binning": state.binning.to_dict()}  # fmt: skip
    manifest = AtlasManifest(spec, ["synthetic"], complete=True,
                             info={"windows": windows, "tokens": windows * context})  # fmt: skip
    write_manifest(folder, manifest)
    return Synthetic(folder, acts, tokens, state)
