"""What sets an attention score (the QK side): the pre-softmax score of head (l, h) from query
position t to key position s, split over the graph's nodes.

With norm scales frozen the query at t is affine in the node coefficients (nodes at t write it
directly, earlier positions' nodes reach it through lower layers' frozen patterns), and so is
the key at s; rotary is a fixed linear map per position, so it sits inside q and k. A node's
query-side share is its part of the rotated query dotted with the full key (times the scale);
the query-side rest (biases, position 0 left out of the graph, what no node carries) is the
query at zero coefficients dotted with the full key. Shares plus rest are the score, exactly;
likewise on the key side. Shares come from one backward pass per side.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ie_core.circuits.errors import AttributionInputError, ReplacementUnsupportedError
from ie_core.circuits.graph import Graph
from ie_core.circuits.heads import graph_source, per_source, prompt_inputs, trunk
from ie_core.circuits.prompt_state import PromptState
from ie_core.circuits.weights import SUPPORTED, hf_model_for

_LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(frozen=True)
class QKLayer:
    """One layer's query and key projections (`nn.Linear` layout), per-head query / key norms
    (QK-norm families: weight and eps; their scales are frozen at the prompt's values)."""

    W_Q: torch.Tensor  # [n_heads * head_dim, d]
    b_Q: torch.Tensor | None
    W_K: torch.Tensor  # [n_kv_heads * head_dim, d]
    b_K: torch.Tensor | None
    q_norm: tuple[torch.Tensor, float] | None
    k_norm: tuple[torch.Tensor, float] | None
    scale: float  # what q.k is multiplied by
    window: int | None  # sliding window: keys at t - s >= window are masked


@dataclass(frozen=True)
class QKWeights:
    """The query / key side of a model: per layer `QKLayer`, and the rotary (rotate-half) cos /
    sin `[max_positions, rotary_dim]` (None for learned positions, GPT-2)."""

    layers: tuple[QKLayer, ...]
    cos: torch.Tensor | None
    sin: torch.Tensor | None
    family: str


def _f32(x: torch.Tensor | None) -> torch.Tensor | None:
    return None if x is None else _t(x)


def _t(x: torch.Tensor) -> torch.Tensor:
    return x.detach().to(device="cpu", dtype=torch.float32)


def _llama_qk(hf: Any, cfg: Any, n_pos: int) -> QKWeights:
    window = getattr(cfg, "sliding_window", None) if cfg.model_type == "mistral" else None
    if cfg.model_type in ("qwen2", "qwen3") and getattr(cfg, "use_sliding_window", False):
        raise ReplacementUnsupportedError(
            "attention_shares does not build Qwen's per-layer sliding windows; use a config "
            "with use_sliding_window=False or read the pattern (attn_probs) instead"
        )
    layers = []
    for block in hf.model.layers:
        a = block.self_attn
        norms = []
        for name in ("q_norm", "k_norm"):
            m = getattr(a, name, None)
            eps = None if m is None else getattr(m, "variance_epsilon", getattr(m, "eps", None))
            norms.append(None if m is None else (_t(m.weight), float(eps or 1e-6)))
        layers.append(
            QKLayer(
                _t(a.q_proj.weight),
                _f32(a.q_proj.bias),
                _t(a.k_proj.weight),
                _f32(a.k_proj.bias),
                norms[0],
                norms[1],
                float(a.scaling),
                window,
            )
        )
    x = torch.zeros(1, n_pos, 1)
    with torch.no_grad():
        cos, sin = hf.model.rotary_emb(x, torch.arange(n_pos)[None])
    return QKWeights(tuple(layers), _t(cos[0]), _t(sin[0]), cfg.model_type)


def _gpt2_qk(hf: Any, cfg: Any) -> QKWeights:
    d, n_heads = int(cfg.n_embd), int(cfg.n_head)
    layers = []
    for i, block in enumerate(hf.transformer.h):
        w, b = block.attn.c_attn.weight, block.attn.c_attn.bias  # Conv1D: [in, 3 * d]
        scale = (d // n_heads) ** -0.5 if cfg.scale_attn_weights else 1.0
        if cfg.scale_attn_by_inverse_layer_idx:
            scale /= i + 1
        layers.append(
            QKLayer(
                _t(w[:, :d].T),
                _t(b[:d]),
                _t(w[:, d : 2 * d].T),
                _t(b[d : 2 * d]),
                None,
                None,
                scale,
                None,
            )
        )
    return QKWeights(tuple(layers), None, None, "gpt2")


def qk_weights_of(hf_model: Any, n_pos: int = 512) -> QKWeights:
    """The query / key side of a loaded HF causal LM (fp32 CPU copies), rotary for `n_pos`."""
    cfg = hf_model.config
    kind = str(getattr(cfg, "model_type", ""))
    if kind in _LLAMA_LIKE:
        return _llama_qk(hf_model, cfg, n_pos)
    if kind == "gpt2":
        return _gpt2_qk(hf_model, cfg)
    raise ReplacementUnsupportedError(
        f"attention scores are split over graph nodes for {', '.join(SUPPORTED)}, not "
        f"{kind!r} (its attention is not softmax(q.k) of linear queries and keys, or its "
        "residual path differs); read its patterns (attn_probs) instead"
    )


def qk_weights_for(model: Any, weights: Any = None, n_pos: int = 512) -> QKWeights:
    """`qk_weights_of` the model's own HF module, or of `weights` (an HF folder) for backends
    that keep weights in other processes (as `attribute(..., weights=)`)."""
    if isinstance(weights, QKWeights):
        return weights
    return qk_weights_of(hf_model_for(model, weights, "the query / key shares"), n_pos)


@dataclass(frozen=True)
class QKShares:
    """The score of head `head` of layer `layer`, query `query_pos`, key `key_pos`, split over
    the state's sources (active features, errors layer-major, tokens): `query_shares.sum() +
    query_rest == score == key_shares.sum() + key_rest`."""

    layer: int
    head: int
    query_pos: int
    key_pos: int
    score: float
    query_shares: torch.Tensor  # [n_sources]
    query_rest: float
    key_shares: torch.Tensor  # [n_sources]
    key_rest: float

    def for_graph(self, st: PromptState, graph: Graph) -> tuple[torch.Tensor, torch.Tensor]:
        """Query- and key-side shares of `graph`'s non-logit nodes, in its node order (features
        the graph left out by a cap keep their shares here only)."""
        cols = torch.tensor([graph_source(st, graph, i) for i in range(graph.logit_offset)])
        return self.query_shares[cols], self.key_shares[cols]


def _rotated(
    x: torch.Tensor, pos: int, norm: tuple[torch.Tensor, float] | None, scale: torch.Tensor | None,
    qw: QKWeights,
) -> torch.Tensor:  # fmt: skip
    """Head vector(s) `[..., head_dim]` after the QK norm (scale frozen: `scale`) and rotary at
    `pos` (rotate-half over the first rotary_dim dims)."""
    if norm is not None:
        assert scale is not None
        x = x * scale * norm[0]
    if qw.cos is None or qw.sin is None:
        return x
    cos, sin = qw.cos[pos], qw.sin[pos]
    r = cos.shape[-1]
    rot, rest = x[..., :r], x[..., r:]
    half = torch.cat((-rot[..., r // 2 :], rot[..., : r // 2]), dim=-1)
    return torch.cat((rot * cos + half * sin, rest), dim=-1)


def _head(
    h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, i: int, hd: int
) -> torch.Tensor:
    """Head `i`'s projection `[head_dim]` of one normed residual row."""
    rows = slice(i * hd, (i + 1) * hd)
    out = w[rows] @ h
    return out if b is None else out + b[rows]


def _check(st: PromptState, qw: QKWeights, layer: int, head: int, t: int, s: int) -> None:
    if not isinstance(qw, QKWeights):
        raise AttributionInputError("pass qk_weights_for(model) as qk")
    if qw.family != st.weights.family or len(qw.layers) != st.n_layers:
        raise AttributionInputError("the QK weights are another model's; use qk_weights_for(model)")
    if not 0 <= layer < st.n_layers or not 0 <= head < st.weights.layers[layer].n_heads:
        raise AttributionInputError(f"no head {head} in layer {layer}")
    if not 0 <= s <= t < st.n_pos:
        raise AttributionInputError(
            f"key position {s} and query position {t}: give 0 <= key <= query < {st.n_pos} "
            "(later keys are masked)"
        )
    if qw.cos is not None and qw.cos.shape[0] < st.n_pos:
        raise AttributionInputError(f"the rotary covers {qw.cos.shape[0]} positions; pass n_pos")
    window = qw.layers[layer].window
    if window is not None and t - s >= window:
        raise AttributionInputError(f"key {s} is outside query {t}'s sliding window of {window}")


def attention_shares(
    st: PromptState, qk: QKWeights, layer: int, head: int, query_pos: int, key_pos: int
) -> QKShares:
    """Split head (`layer`, `head`)'s pre-softmax score from `query_pos` to `key_pos` over the
    graph's source nodes, on the query side and on the key side (GQA: the head's key is its
    group's)."""
    _check(st, qk, layer, head, query_pos, key_pos)
    lw, ql = st.weights.layers[layer], qk.layers[layer]
    hd, kv = lw.head_dim, head // (lw.n_heads // lw.n_kv_heads)
    tok, writes = (x.requires_grad_(True) for x in prompt_inputs(st))
    h = trunk(st, tok, writes, stop=layer).attn_in[layer]
    q = _head(h[query_pos], ql.W_Q, ql.b_Q, head, hd)
    k = _head(h[key_pos], ql.W_K, ql.b_K, kv, hd)
    # QK norms: their scales frozen at the prompt's values, as the residual norms' are.
    q_scale = None if ql.q_norm is None else torch.rsqrt(q.detach().pow(2).mean() + ql.q_norm[1])
    k_scale = None if ql.k_norm is None else torch.rsqrt(k.detach().pow(2).mean() + ql.k_norm[1])
    q_rot = _rotated(q, query_pos, ql.q_norm, q_scale, qk) * ql.scale
    k_rot = _rotated(k, key_pos, ql.k_norm, k_scale, qk)
    score = q_rot @ k_rot
    # Layer 0 reads no MLP write: its gradient is zeros (materialised), not an error.
    g_q = torch.autograd.grad(
        q_rot @ k_rot.detach(), (tok, writes), retain_graph=True, allow_unused=True,
        materialize_grads=True,
    )  # fmt: skip
    g_k = torch.autograd.grad(
        q_rot.detach() @ k_rot, (tok, writes), allow_unused=True, materialize_grads=True
    )
    with torch.no_grad():  # the rest: q (k) at zero coefficients against the full k (q)
        h0 = trunk(st, torch.zeros_like(tok), st.sources.mlp_const, stop=layer).attn_in[layer]
        q0 = _rotated(
            _head(h0[query_pos], ql.W_Q, ql.b_Q, head, hd), query_pos, ql.q_norm, q_scale, qk
        )
        k0 = _rotated(_head(h0[key_pos], ql.W_K, ql.b_K, kv, hd), key_pos, ql.k_norm, k_scale, qk)
    return QKShares(
        layer, head, query_pos, key_pos, float(score.detach()),
        per_source(st, *g_q).detach(), float(q0 * ql.scale @ k_rot.detach()),
        per_source(st, *g_k).detach(), float(q_rot.detach() @ k0),
    )  # fmt: skip


__all__ = [
    "QKLayer",
    "QKShares",
    "QKWeights",
    "attention_shares",
    "qk_weights_for",
    "qk_weights_of",
]
