"""The forward half of attribution: one capture of everything the graph needs, through the
model's public capture API (any capturing backend), turned into the frozen replacement's
constants, the active features and the logit targets."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ie_core.circuits.errors import AttributionInputError, TranscoderLayerError
from ie_core.circuits.graph import LogitTarget
from ie_core.circuits.replacement import Frozen, Sources, norm_scale
from ie_core.circuits.transcoders import TranscoderSet
from ie_core.circuits.weights import ReplacementWeights
from ie_core.experiments.sae_math import activate, pre_acts


@dataclass(frozen=True)
class PromptState:
    """One prompt's captured forward, ready for the backward passes. `freeze_norms=False`
    (tests only) makes the replacement recompute norm scales: the unfrozen negative control."""

    tokens: tuple[int, ...]
    weights: ReplacementWeights
    frozen: Frozen
    sources: Sources
    active_features: torch.Tensor  # [n, 3] (layer, pos, feature), lexicographic
    activation_values: torch.Tensor  # [n]
    encoder_vecs: torch.Tensor  # [n, d] the W_enc column each feature reads with
    encoder_bias: torch.Tensor  # [n] b_enc of each feature
    pre_activations: torch.Tensor  # [n] from the captured mlp_in: the features' true inputs
    logit_targets: tuple[LogitTarget, ...]
    unembed_dirs: torch.Tensor  # [n_logits, d] W_U rows less the mean row
    unembed_bias: torch.Tensor  # [n_logits] b_U less its mean (0 without one)
    demeaned_logits: torch.Tensor  # [n_logits] from the model's own logits
    logits: torch.Tensor  # [pos, vocab] the model's logits (its final norm's output unembedded)
    freeze_norms: bool = True

    @property
    def n_layers(self) -> int:
        return len(self.weights.layers)

    @property
    def n_pos(self) -> int:
        return len(self.tokens)


def moved(value: Any, device: torch.device | str) -> Any:
    """`value` with every tensor in it (frozen dataclasses, tuples) on `device`."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, tuple):
        return tuple(moved(v, device) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: moved(getattr(value, f.name), device) for f in dataclasses.fields(value)}
        return dataclasses.replace(value, **fields)
    return value


def addresses(n_layers: int) -> list[str]:
    """What the forward captures: norm inputs (their scales), patterns, transcoder inputs and
    outputs, the token embeddings and the final norm's output (the logits are its unembed: vLLM
    serves no lm_head point, and the families traced here have no logit softcap)."""
    per_layer = ("resid_pre", "attn_probs", "resid_mid", "mlp_in", "mlp_out")
    out = [f"{p}.{layer}" for layer in range(n_layers) for p in per_layer]
    return ["embeddings", *out, f"resid_post.{n_layers - 1}", "final_norm"]


def unembed(w: ReplacementWeights, final: torch.Tensor) -> torch.Tensor:
    """Logits `[..., vocab]` of final-norm rows."""
    logits = final.float() @ w.W_U.T
    return logits if w.b_U is None else logits + w.b_U


def check_prompt(tokens: Sequence[int], limit: int | None) -> None:
    if not tokens:
        raise AttributionInputError("the prompt has no tokens; give a non-empty prompt")
    if limit is not None and len(tokens) > limit:
        raise AttributionInputError(
            f"the prompt has {len(tokens)} tokens but the model's context is {limit}; shorten it"
        )


def _features(
    ts: TranscoderSet, mlp_in: torch.Tensor, zero_first: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per layer pre-activations and activations `[L, pos, d_sae]` (position 0 zeroed when
    `zero_first`, as circuit-tracer leaves the first position's features out), and the
    reconstruction `[L, pos, d]` less `b_dec`: at layer L the sum of every decoder into it."""
    pres, acts = [], []
    recon = torch.zeros(mlp_in.shape)
    for layer, tc in enumerate(ts.transcoders):
        pre = pre_acts(mlp_in[layer], tc.weights, tc.meta)
        act = activate(pre, tc.weights, tc.meta)
        if zero_first:
            act[0] = 0
        pres.append(pre)
        acts.append(act)
        dec = ts.decoders(layer).float()  # [d_sae, n_writes, d]
        recon[layer : layer + dec.shape[1]] += torch.einsum("pf,fkd->kpd", act, dec)
    return torch.stack(pres), torch.stack(acts), recon


def _writes(
    ts: TranscoderSet, idx: torch.Tensor, values: torch.Tensor, n_pos: int
) -> tuple[torch.Tensor, ...]:
    """The features' writes (feature, layer, position, activation x decoder row), sorted by
    (layer, position) so the backward passes contract them a (layer, position) group at once."""
    d = ts.transcoders[0].d_out
    feats, layers, poss, vecs = [], [], [], []
    for layer in range(ts.n_layers):
        ids = (idx[:, 0] == layer).nonzero()[:, 0]
        dec = ts.decoders(layer).float()
        k = dec.shape[1]
        feats.append(ids.repeat_interleave(k))
        layers.append(torch.arange(layer, layer + k).repeat(len(ids)))
        poss.append(idx[ids, 1].repeat_interleave(k))
        vecs.append((dec[idx[ids, 2]] * values[ids, None, None]).reshape(-1, d))
    feat, lay, pos = torch.cat(feats), torch.cat(layers), torch.cat(poss)
    order = torch.argsort(lay * n_pos + pos, stable=True)
    return feat[order], lay[order], pos[order], torch.cat(vecs)[order]


def logit_targets(
    logits: torch.Tensor, max_n_logits: int, desired_logit_prob: float, to_string: Any
) -> tuple[LogitTarget, ...]:
    """The most probable next tokens, fewest whose probabilities sum to `desired_logit_prob`
    (at most `max_n_logits`), as circuit-tracer's salient-logit choice."""
    probs = torch.softmax(logits.double(), -1)
    top_p, top_i = torch.topk(probs, min(max_n_logits, probs.numel()))
    n = int(torch.searchsorted(torch.cumsum(top_p, 0), desired_logit_prob)) + 1
    return tuple(
        LogitTarget(int(i), to_string([int(i)]), float(p))
        for p, i in zip(top_p[:n], top_i[:n], strict=True)
    )


def build_state(
    tokens: Sequence[int],
    cache: Any,
    ts: TranscoderSet,
    w: ReplacementWeights,
    targets: tuple[LogitTarget, ...],
    *,
    zero_first: bool = True,
) -> PromptState:
    """The frozen replacement's constants and the nodes, from a capture of `addresses()`."""
    n_layers = len(w.layers)
    if ts.n_layers != n_layers:
        raise TranscoderLayerError(f"{ts.n_layers} transcoders for {n_layers} layers")

    def get(a: str) -> torch.Tensor:
        return cache[a][0].detach().to(device="cpu", dtype=torch.float32)

    mlp_in = torch.stack([get(f"mlp_in.{layer}") for layer in range(n_layers)])
    mlp_out = torch.stack([get(f"mlp_out.{layer}") for layer in range(n_layers)])
    frozen = Frozen(
        tuple(get(f"attn_probs.{layer}") for layer in range(n_layers)),
        torch.stack([norm_scale(get(f"resid_pre.{i}"), lw.norm1) for i, lw in enumerate(w.layers)]),
        torch.stack([norm_scale(get(f"resid_mid.{i}"), lw.norm2) for i, lw in enumerate(w.layers)]),
        norm_scale(get(f"resid_post.{n_layers - 1}"), w.final_norm),
    )
    pre, acts, recon = _features(ts, mlp_in, zero_first)
    idx = acts.nonzero()  # lexicographic (layer, pos, feature)
    layer_i, pos_i, feat_i = idx.unbind(1)
    values = acts[layer_i, pos_i, feat_i]
    w_enc = [tc.weights["W_enc"].float() for tc in ts.transcoders]
    b_enc = [tc.weights["b_enc"].float() for tc in ts.transcoders]
    rows = [(int(a), int(b)) for a, b in zip(layer_i, feat_i, strict=True)]
    write_feat, write_layer, write_pos, dec_vecs = _writes(ts, idx, values, len(tokens))
    enc_vecs = torch.stack([w_enc[a][:, f] for a, f in rows]) if rows else None
    d = mlp_in.shape[-1]
    errors = (
        mlp_out
        - recon
        - torch.stack([tc.weights["b_dec"].float() for tc in ts.transcoders])[:, None]
    )
    if zero_first:
        errors[:, 0] = 0
    empty = torch.zeros(0, d)
    sources = Sources(
        token_vectors=get("embeddings"),
        position_const=get("resid_pre.0") - get("embeddings"),
        write_feat=write_feat,
        write_layer=write_layer,
        write_pos=write_pos,
        decoder_vecs=dec_vecs,
        errors=errors,
        mlp_const=mlp_out - errors - recon,
    )
    logits = unembed(w, get("final_norm"))
    ids = torch.tensor([t.token_id for t in targets], dtype=torch.long)
    dirs = w.W_U[ids] - w.W_U.mean(0)
    bias = torch.zeros(len(ids)) if w.b_U is None else w.b_U[ids] - w.b_U.mean()
    return PromptState(
        tokens=tuple(int(t) for t in tokens),
        weights=w,
        frozen=frozen,
        sources=sources,
        active_features=idx,
        activation_values=values,
        encoder_vecs=empty if enc_vecs is None else enc_vecs,
        encoder_bias=torch.stack([b_enc[a][f] for a, f in rows]) if rows else torch.zeros(0),
        pre_activations=pre[layer_i, pos_i, feat_i],
        logit_targets=targets,
        unembed_dirs=dirs,
        unembed_bias=bias,
        demeaned_logits=logits[-1, ids] - logits[-1].mean(),
        logits=logits,
    )


__all__ = [
    "PromptState",
    "addresses",
    "build_state",
    "check_prompt",
    "logit_targets",
    "moved",
    "unembed",
]
