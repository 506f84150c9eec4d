"""The frozen linear replacement of one prompt's forward: attention patterns and norm scales fixed
at their captured values, each MLP replaced by its transcoder's features plus an error term.

Every node of the graph is a source coefficient `c` (1 at this prompt): token embeddings, active
features (activation x decoder row, written at `mlp_out.L`, and for a cross-layer transcoder at
every later `mlp_out` too, all under the one coefficient) and error nodes (what the transcoders
miss at `mlp_out.L`). With patterns and scales frozen the forward is affine in `c`, so the
derivative of a node's input along `c_s` is the direct effect of source `s` on it, and the
inputs at `c = 0` are the nodes' biases.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ie_core.circuits.weights import LayerWeights, NormWeights, ReplacementWeights


@dataclass(frozen=True)
class Sources:
    """The source nodes of one prompt and the constants written beside them."""

    token_vectors: torch.Tensor  # [pos, d] the embeddings point, one node per position
    position_const: torch.Tensor  # [pos, d] what enters resid_pre.0 beside them (GPT-2 positions)
    # The features' writes, sorted by (layer, position): write i adds decoder_vecs[i] (activation
    # x a decoder row) to mlp_out.write_layer[i] at write_pos[i], under feature write_feat[i]'s
    # coefficient. One write per feature for a per-layer set, one per later layer for a CLT.
    write_feat: torch.Tensor  # [m] int64
    write_layer: torch.Tensor  # [m] int64
    write_pos: torch.Tensor  # [m] int64
    decoder_vecs: torch.Tensor  # [m, d]
    errors: torch.Tensor  # [n_layers, pos, d] mlp_out minus the transcoder's output
    mlp_const: torch.Tensor  # [n_layers, pos, d] b_dec and any part left to no node


@dataclass(frozen=True)
class Frozen:
    """The prompt's attention patterns `[heads, q, k]` per layer and norm scales per position."""

    patterns: tuple[torch.Tensor, ...]
    scale_attn: torch.Tensor  # [n_layers, pos] the attention norm's scale
    scale_mlp: torch.Tensor  # [n_layers, pos] the MLP norm's scale
    scale_final: torch.Tensor  # [pos]


@dataclass(frozen=True)
class ReplacementOutput:
    mlp_in: torch.Tensor  # [n_layers, pos, d] the transcoders' inputs
    final: torch.Tensor  # [pos, d] the final norm's output
    logits: torch.Tensor  # [pos, vocab]
    # The same inputs layer by layer, outside the stack: a backward pass from the first L of
    # them stops at layer 0 without going through the layers above.
    mlp_in_layers: tuple[torch.Tensor, ...] = ()


def norm_scale(x: torch.Tensor, norm: NormWeights) -> torch.Tensor:
    """The per-row scale the norm multiplies by: 1 / sqrt(variance + eps) for LayerNorm, 1 /
    sqrt(mean square + eps) for RMSNorm."""
    x = x.float()
    if norm.centred:
        return torch.rsqrt(x.var(-1, unbiased=False) + norm.eps)
    return torch.rsqrt(x.pow(2).mean(-1) + norm.eps)


def _norm(x: torch.Tensor, norm: NormWeights, scale: torch.Tensor | None) -> torch.Tensor:
    """The norm with `scale` held fixed (linear in x); `scale=None` recomputes it from x."""
    s = norm_scale(x, norm) if scale is None else scale
    h = x - x.mean(-1, keepdim=True) if norm.centred else x
    out = h * s[..., None] * norm.weight
    return out if norm.bias is None else out + norm.bias


def _mixed_values(h: torch.Tensor, pattern: torch.Tensor, lw: LayerWeights) -> torch.Tensor:
    """Each head's pattern-weighted values `[pos, n_heads, head_dim]` (before `W_O`)."""
    v = h @ lw.W_V.T if lw.b_V is None else h @ lw.W_V.T + lw.b_V
    v = v.view(h.shape[0], lw.n_kv_heads, lw.head_dim)
    v = v.repeat_interleave(lw.n_heads // lw.n_kv_heads, dim=1)  # grouped-query heads
    return torch.einsum("hqk,khd->qhd", pattern, v)


@dataclass(frozen=True)
class Trunk:
    """The replacement's forward with its per-layer intermediates: the attention norm's output
    `[pos, d]`, each head's mixed values `[pos, n_heads, head_dim]`, the MLP inputs, the final
    norm's output (None where the walk stopped early)."""

    attn_in: tuple[torch.Tensor, ...]
    z: tuple[torch.Tensor, ...]
    mlp_in: tuple[torch.Tensor, ...]
    final: torch.Tensor | None


def trunk(
    w: ReplacementWeights, frozen: Frozen, src: Sources, token_part: torch.Tensor,
    writes: torch.Tensor, *, freeze_norms: bool = True,
    z_add: Sequence[torch.Tensor] | None = None, stop: int | None = None,
) -> Trunk:  # fmt: skip
    """The replacement's forward given what the token nodes put into the residual
    (`token_part` `[pos, d]`) and what each MLP writes (`writes` `[n_layers, pos, d]`), keeping
    the intermediates. `z_add[l]` is added to layer l's mixed values (zeros whose gradient is a
    target's gradient at z); `stop=L` ends at layer L's attention norm (what its queries and
    keys read); `freeze_norms=False` recomputes norm scales (not linear: a negative control)."""
    resid = src.position_const + token_part
    attn_in, zs, mlp_in = [], [], []
    for layer, lw in enumerate(w.layers):
        h = _norm(resid, lw.norm1, frozen.scale_attn[layer] if freeze_norms else None)
        attn_in.append(h)
        if layer == stop:
            return Trunk(tuple(attn_in), tuple(zs), tuple(mlp_in), None)
        z = _mixed_values(h, frozen.patterns[layer], lw)
        if z_add is not None:
            z = z + z_add[layer]
        zs.append(z)
        out = z.reshape(h.shape[0], -1) @ lw.W_O.T
        resid = resid + (out if lw.b_O is None else out + lw.b_O)
        mlp_in.append(_norm(resid, lw.norm2, frozen.scale_mlp[layer] if freeze_norms else None))
        resid = resid + writes[layer]
    final = _norm(resid, w.final_norm, frozen.scale_final if freeze_norms else None)
    return Trunk(tuple(attn_in), tuple(zs), tuple(mlp_in), final)


def mlp_writes(src: Sources, c_feat: torch.Tensor, c_err: torch.Tensor) -> torch.Tensor:
    """What each layer's MLP adds to the residual `[n_layers, pos, d]` at coefficients `c`."""
    writes = src.mlp_const + c_err[..., None] * src.errors
    scaled = c_feat[src.write_feat, None] * src.decoder_vecs
    return writes.index_put((src.write_layer, src.write_pos), scaled, accumulate=True)


def run_replacement(
    w: ReplacementWeights,
    frozen: Frozen,
    src: Sources,
    token_part: torch.Tensor,
    writes: torch.Tensor,
    *,
    freeze_norms: bool = True,
) -> ReplacementOutput:
    """`trunk`'s forward through the unembed (`token_part` `c_tok * token_vectors`, `writes`
    from `mlp_writes`)."""
    out = trunk(w, frozen, src, token_part, writes, freeze_norms=freeze_norms)
    assert out.final is not None
    logits = out.final @ w.W_U.T
    if w.b_U is not None:
        logits = logits + w.b_U
    return ReplacementOutput(torch.stack(out.mlp_in), out.final, logits, out.mlp_in)


def run_at(
    w: ReplacementWeights,
    frozen: Frozen,
    src: Sources,
    c_feat: torch.Tensor,
    c_err: torch.Tensor,
    c_tok: torch.Tensor,
    *,
    freeze_norms: bool = True,
) -> ReplacementOutput:
    """The forward at source coefficients `c` (all ones: this prompt; all zeros: the biases)."""
    token_part = c_tok[:, None] * src.token_vectors
    return run_replacement(
        w, frozen, src, token_part, mlp_writes(src, c_feat, c_err), freeze_norms=freeze_norms
    )


__all__ = [
    "Frozen",
    "ReplacementOutput",
    "Sources",
    "Trunk",
    "mlp_writes",
    "norm_scale",
    "run_at",
    "run_replacement",
    "trunk",
]
