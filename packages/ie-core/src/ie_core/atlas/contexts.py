"""After the pass: each kept context's per-token activations of its feature, and each feature's
decoder logits through the unembed.

Contexts are recomputed from the same windows (the corpus is read again, and only the windows a
feature keeps run), so the activation at a context's recorded position is the pass's number; the
largest difference seen is returned for the manifest (0 where the backend batches alike; fp32
noise where a different batch shape changes the sums' order).

Logits are `W_dec[f] @ W_U.T` (the unembed alone, no final norm: as SAEDashboard and
Neuronpedia show them); computed only where the decoder writes d_model-wide rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from ie_core.atlas.state import AtlasState
from ie_core.errors import UnsupportedOperationError
from ie_core.experiments.features import feature_activations
from ie_core.experiments.saes import SAE
from ie_core.harvest.windows import Window

__all__: list[str] = []  # used by ie_core.atlas.running and merging only

FEATURE_CHUNK = 1024


def _needed(state: AtlasState) -> list[int]:
    seqs = torch.cat([state.top_sequence.flatten(), state.sample_sequence.flatten()])
    return sorted(int(s) for s in seqs[seqs >= 0].unique().tolist())


def _fill(
    out: torch.Tensor, seqs: torch.Tensor, acts_of: dict[int, torch.Tensor], features: torch.Tensor
) -> None:
    """`out[slot, :len]` = the activations of the slot's feature in the slot's window."""
    flat_out = out.view(-1, out.shape[-1])
    flat_seq = seqs.flatten()
    flat_feature = features.expand_as(seqs).flatten()
    for seq, acts in acts_of.items():
        slots = (flat_seq == seq).nonzero(as_tuple=True)[0]
        if slots.numel():
            flat_out[slots, : acts.shape[0]] = acts[:, flat_feature[slots]].T.to(out.device)


def context_tensors(
    model: Any, sae: SAE, state: AtlasState, windows: Callable[[], Iterator[tuple[int, Window]]],
    batch_windows: int,
) -> tuple[dict[str, torch.Tensor], float]:  # fmt: skip
    """`top_acts` `[d_sae, k, context]` and `sample_acts` `[d_sae, bands, samples, context]`
    (0 past a window's end), the windows' `window_tokens` `[n, context]` (-1 past the end) and
    `window_sequence` `[n]`; and the largest |recomputed - pass| value at the kept positions."""
    needed = set(_needed(state))
    found = [(i, w) for i, w in windows() if i in needed]
    context = max((len(w.tokens) for _, w in found), default=1)
    d, k = state.d_sae, state.k
    top = torch.zeros(d, k, context)
    sample = torch.zeros(*state.sample_sequence.shape, context)
    feature_top = torch.arange(d).view(d, 1)
    feature_sample = torch.arange(d).view(d, 1, 1)
    top_seq, sample_seq = state.top_sequence.cpu(), state.sample_sequence.cpu()
    for start in range(0, len(found), batch_windows):
        batch = found[start : start + batch_windows]
        acts_of: dict[int, torch.Tensor] = {}
        for length in sorted({len(w.tokens) for _, w in batch}):
            group = [(i, w) for i, w in batch if len(w.tokens) == length]
            got = feature_activations(model, [list(w.tokens) for _, w in group], sae).acts
            assert got is not None
            acts_of.update({i: got[row].float().cpu() for row, (i, _) in enumerate(group)})
        _fill(top, top_seq, acts_of, feature_top)
        _fill(sample, sample_seq, acts_of, feature_sample)
    tokens = torch.full((len(found), context), -1, dtype=torch.int64)
    for row, (_, w) in enumerate(found):
        tokens[row, : len(w.tokens)] = torch.tensor(w.tokens)
    deviation = _deviation(top, state.top_values.cpu(), state.top_position.cpu())
    out = {"top_acts": top, "sample_acts": sample, "window_tokens": tokens,
           "window_sequence": torch.tensor([i for i, _ in found], dtype=torch.int64)}  # fmt: skip
    return out, deviation


def _deviation(acts: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> float:
    kept = positions >= 0
    if not bool(kept.any()):
        return 0.0
    at = acts.gather(-1, positions.clamp_min(0).unsqueeze(-1)).squeeze(-1)
    return float((at[kept] - values[kept]).abs().max())


def unembed_of(model: Any) -> torch.Tensor | None:
    """The unembed `[vocab, d_model]` (fp32, CPU): the model's own `W_U` where its backend holds
    it, else read from the model's folder's safetensors (tied models: the embedding), else None."""
    try:
        return model.W_U.detach().float().cpu().T
    except UnsupportedOperationError:
        pass
    from ie_core.models import resolve_model_path

    folder = resolve_model_path(model.model_id)
    return _read_unembed(folder) if folder is not None else None


def _read_unembed(folder: Path) -> torch.Tensor | None:
    from safetensors import safe_open

    found: dict[str, tuple[Path, str]] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118
                if name.endswith(("lm_head.weight", "embed_tokens.weight", "wte.weight")):
                    found[name.rsplit(".", 2)[-2]] = (path, name)
    pick = found.get("lm_head") or found.get("embed_tokens") or found.get("wte")
    if pick is None:
        return None
    with safe_open(str(pick[0]), framework="pt") as handle:
        return handle.get_tensor(pick[1]).float()


def logit_tensors(model: Any, sae: SAE, n: int) -> tuple[dict[str, torch.Tensor], str]:
    """Each feature's `n` largest and smallest decoder logits (`top_ids` / `top_values`,
    `bottom_ids` / `bottom_values`, `[d_sae, n]`), or none and why."""
    unembed = unembed_of(model)
    if unembed is None:
        return {}, "no unembed found in this process or the model's folder"
    w_dec = sae.weights["W_dec"].float().cpu()
    if w_dec.shape[1] != unembed.shape[1]:
        return {}, (
            f"the decoder writes {w_dec.shape[1]}-wide rows at {sae.out_address} and the "
            f"unembed reads {unembed.shape[1]}: no logits"
        )
    parts: dict[str, list[torch.Tensor]] = {k: [] for k in
                                            ("top_ids", "top_values", "bottom_ids", "bottom_values")}  # fmt: skip
    for start in range(0, w_dec.shape[0], FEATURE_CHUNK):
        logits = w_dec[start : start + FEATURE_CHUNK] @ unembed.T
        top = torch.topk(logits, min(n, logits.shape[1]), dim=1)
        bottom = torch.topk(logits, min(n, logits.shape[1]), dim=1, largest=False)
        parts["top_ids"].append(top.indices)
        parts["top_values"].append(top.values)
        parts["bottom_ids"].append(bottom.indices)
        parts["bottom_values"].append(bottom.values)
    return {k: torch.cat(v) for k, v in parts.items()}, ""
