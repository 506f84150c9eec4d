"""The graph's rows: the gradient of each target's input (a feature's pre-activation, a logit
target's demeaned logit) with respect to every source coefficient, through the frozen replacement.

`TransposedRows` applies the replacement's transpose by hand, layer by layer from the top: with
patterns and norm scales frozen the replacement is linear, so its backward needs no forward, no
autograd graph and no activations. A batch's rows are sorted by target layer, highest first, and
a row joins the pass only at its own layer (the rows still in it are a prefix); under causal
patterns a batch also stops at its last target position, since nothing later reaches it.
`AutogradRows` is the same rows through `torch.autograd` on the replacement's own forward: the
reference the tests compare against, and the only one that honours `freeze_norms=False` (the
unfrozen negative control, whose map is not linear).
"""

from __future__ import annotations

import torch

from ie_core.circuits.prompt_state import PromptState
from ie_core.circuits.replacement import mlp_writes, run_at, run_replacement
from ie_core.circuits.weights import LayerWeights, NormWeights


def row_width(st: PromptState) -> int:
    """Columns of a row: every active feature, then every error node, then every token."""
    return st.active_features.shape[0] + (st.n_layers + 1) * st.n_pos


def target_inputs(st: PromptState, mlp_in: torch.Tensor, final: torch.Tensor) -> torch.Tensor:
    """Every active feature's pre-activation, then every logit target's demeaned logit."""
    f_layer, f_pos, _ = st.active_features.unbind(1)
    feats = (mlp_in[f_layer, f_pos] * st.encoder_vecs).sum(-1) + st.encoder_bias
    logits = st.unembed_dirs @ final[-1] + st.unembed_bias
    return torch.cat([feats, logits])


def biases(st: PromptState) -> torch.Tensor:
    """Every target's input with every source off (c = 0): its bias, on the CPU."""
    n_feat, dev = st.active_features.shape[0], st.sources.token_vectors.device
    zeros = (
        torch.zeros(n_feat, device=dev),
        torch.zeros(st.n_layers, st.n_pos, device=dev),
        torch.zeros(st.n_pos, device=dev),
    )
    with torch.no_grad():
        off = run_at(st.weights, st.frozen, st.sources, *zeros, freeze_norms=st.freeze_norms)
        return target_inputs(st, off.mlp_in, off.final).cpu()


def _norm_t(g: torch.Tensor, norm: NormWeights, scale: torch.Tensor) -> torch.Tensor:
    """The frozen norm's transpose: the scale and weight are diagonal, centring is symmetric."""
    h = g * norm.weight
    if norm.centred:
        h = h - h.mean(-1, keepdim=True)
    return h * scale[..., None]


def _attention_map(lw: LayerWeights, pattern: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Layer `lw`'s output projection, its value projection with the attention norm's weight and
    centring folded in (both are fixed linear maps on the same side), and the pattern grouped as
    `[value heads, heads per value head, q, k]`."""
    w_v = lw.W_V * lw.norm1.weight
    if lw.norm1.centred:
        w_v = w_v - w_v.mean(-1, keepdim=True)
    group = lw.n_heads // lw.n_kv_heads  # grouped-query heads share a value head
    return lw.W_O, w_v, pattern.view(lw.n_kv_heads, group, *pattern.shape[1:])


class TransposedRows:
    """Rows by the replacement's transpose applied by hand (see the module docstring)."""

    def __init__(self, st: PromptState) -> None:
        self.st = st
        src, fz = st.sources, st.frozen
        self.n_feat = st.active_features.shape[0]
        self.device = src.token_vectors.device
        # Causal patterns let a batch stop at its last target position: checked, not assumed.
        self.causal = all(bool((p.triu(1) == 0).all()) for p in fz.patterns)
        # The cotangent each target puts into the residual: a feature's encoder column through
        # its MLP norm at its own position (per batch, `feat_in`: a copy for every active
        # feature would be as large as the encoder columns), a logit's unembed row through the
        # final norm.
        self.norm2 = st.weights.layers[0].norm2
        self.w2 = torch.stack([lw.norm2.weight for lw in st.weights.layers]).to(self.device)
        self.logit_in = _norm_t(st.unembed_dirs, st.weights.final_norm, fz.scale_final[-1])
        self.maps = [
            _attention_map(lw, p) for lw, p in zip(st.weights.layers, fz.patterns, strict=True)
        ]
        # Each layer's writes as (position, first, last) runs of the (layer, position) order.
        keys = (src.write_layer * st.n_pos + src.write_pos).cpu()
        bounds = torch.searchsorted(keys, torch.arange(st.n_layers * st.n_pos + 1)).tolist()
        self.groups = [
            [(p, bounds[k * st.n_pos + p], bounds[k * st.n_pos + p + 1]) for p in range(st.n_pos)]
            for k in range(st.n_layers)
        ]
        # A per-layer set writes feature i as write i: columns are then slices, not scatters.
        self.one_write = bool(
            len(src.write_feat) == self.n_feat
            and (src.write_feat.cpu() == torch.arange(self.n_feat)).all()
        )

    def feat_in(self, ids: torch.Tensor) -> torch.Tensor:
        """Features `ids`' encoder columns through their MLP norms at their own positions."""
        st = self.st
        f_layer, f_pos = st.active_features[ids, 0], st.active_features[ids, 1]
        per_feat = NormWeights(self.w2[f_layer], None, self.norm2.eps, self.norm2.centred)
        return _norm_t(st.encoder_vecs[ids], per_feat, st.frozen.scale_mlp[f_layer, f_pos])

    def layer_pos(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each target's layer (n_layers for a logit) and position, on the CPU."""
        st = self.st
        af = st.active_features.cpu()
        is_feat = ids < self.n_feat
        fi = ids.clamp(max=max(self.n_feat - 1, 0))
        layer = torch.where(is_feat, af[fi, 0] if self.n_feat else ids, st.n_layers)
        pos = torch.where(is_feat, af[fi, 1] if self.n_feat else ids, st.n_pos - 1)
        return layer, pos

    def rows(self, ids: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows `[len(ids), row_width]` of targets `ids` (features, then logits), on the CPU,
        written into `out` where given (a caller's table: no second batch of rows)."""
        ids = ids.cpu()
        layer, pos = self.layer_pos(ids)
        order = torch.argsort(layer, descending=True, stable=True)
        out = torch.empty(len(ids), row_width(self.st)) if out is None else out
        out[order] = self._sorted_rows(ids[order], layer[order], pos[order]).cpu()
        return out

    def _sorted_rows(
        self, ids: torch.Tensor, layer: torch.Tensor, pos: torch.Tensor
    ) -> torch.Tensor:
        st, src, dev = self.st, self.st.sources, self.device
        n, n_pos, d = len(ids), st.n_pos, src.token_vectors.shape[-1]
        width = int(pos.max()) + 1 if self.causal and n else n_pos
        out = torch.zeros(n, row_width(st), device=dev)
        errors = torch.zeros(n, st.n_layers, n_pos, device=dev)
        g = torch.zeros(n, width, d, device=dev)  # the cotangent at the current residual
        rows, dev_ids, dev_pos = torch.arange(n, device=dev), ids.to(dev), pos.to(dev)
        is_logit = layer == st.n_layers
        n_in = int(is_logit.sum())  # rows in the pass: a prefix, since rows are layer-sorted
        g[rows[:n_in], dev_pos[:n_in]] = self.logit_in[dev_ids[:n_in] - self.n_feat]
        counts = torch.bincount(layer, minlength=st.n_layers + 1).tolist()
        for k in range(st.n_layers - 1, -1, -1):
            # Rows above layer k read what layer k's MLP writes: contract them with its writes.
            if n_in:
                self._contract(out, errors, g[:n_in], k, width)
            lo, n_in = n_in, n_in + counts[k]
            if n_in == lo and not lo:
                continue  # no row has started yet
            if n_in > lo:
                g[rows[lo:n_in], dev_pos[lo:n_in]] += self.feat_in(dev_ids[lo:n_in])
            self._attention_t(g[:n_in], k, width)
        out[:, self.n_feat : -n_pos] = errors.view(n, -1)
        out[:, -n_pos:][:, :width] = (g * src.token_vectors[:width]).sum(-1)
        return out

    def _contract(
        self, out: torch.Tensor, errors: torch.Tensor, g: torch.Tensor, k: int, width: int
    ) -> None:
        """Rows' gradients at layer k's MLP output, dotted with each write and error vector."""
        src, m = self.st.sources, g.shape[0]
        for p, lo, hi in self.groups[k][:width]:
            if hi == lo:
                continue
            part = g[:, p] @ src.decoder_vecs[lo:hi].T
            if self.one_write:
                out[:m, lo:hi] += part
            else:  # a CLT feature's writes at several layers add up into its one column
                out[:m].index_add_(1, src.write_feat[lo:hi], part)
        errors[:m, k, :width] = torch.einsum("npd,pd->np", g, src.errors[k, :width])

    def _attention_t(self, g: torch.Tensor, k: int, width: int) -> None:
        """g += the transpose of layer k's `attn(norm1(x))` applied to g, in place."""
        lw, (w_o, w_v, pattern), n = self.st.weights.layers[k], self.maps[k], g.shape[0]
        gz = (g @ w_o).view(n, width, lw.n_kv_heads, -1, lw.head_dim)
        # Heads sharing a value head sum into it within the one contraction over queries.
        gv = torch.einsum("vgqk,nqvgd->nkvd", pattern[:, :, :width, :width], gz)
        g.addcmul_(gv.reshape(n, width, -1) @ w_v, self.st.frozen.scale_attn[k, :width, None])


class AutogradRows:
    """The replacement's forward with its autograd graph kept; `rows(ids)` runs one batched
    backward pass from the targets' read-out vectors to the residual writes and contracts the
    gradients with each source's write vector."""

    def __init__(self, st: PromptState) -> None:
        src = st.sources
        n_feat = st.active_features.shape[0]
        dev = src.token_vectors.device
        ones = (torch.ones(n_feat, device=dev), torch.ones(st.n_layers, st.n_pos, device=dev))
        self.token_part = src.token_vectors.clone().requires_grad_(True)
        self.writes = mlp_writes(src, *ones).requires_grad_(True)
        out = run_replacement(
            st.weights, st.frozen, src, self.token_part, self.writes, freeze_norms=st.freeze_norms
        )
        self.layers_out, self.final, self.st = out.mlp_in_layers, out.final, st

    def rows(self, ids: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        st, dev = self.st, self.final.device
        ids = ids.to(dev)
        n_feat, b = st.active_features.shape[0], len(ids)
        d = self.final.shape[-1]
        g_in = torch.zeros(b, st.n_layers, st.n_pos, d, device=dev)
        g_final = torch.zeros(b, st.n_pos, d, device=dev)
        is_feat = ids < n_feat
        fi = ids[is_feat]
        g_in[is_feat.nonzero()[:, 0], st.active_features[fi, 0], st.active_features[fi, 1]] = (
            st.encoder_vecs[fi]
        )
        g_final[(~is_feat).nonzero()[:, 0], -1] = st.unembed_dirs[ids[~is_feat] - n_feat]
        g_tok, g_w = torch.autograd.grad(
            [*self.layers_out, self.final], (self.token_part, self.writes),
            [*g_in.unbind(1), g_final], retain_graph=True, is_grads_batched=True,
            allow_unused=True, materialize_grads=True,
        )  # fmt: skip
        src = st.sources
        feats = torch.zeros(b, n_feat, device=dev)
        g_at = g_w[:, src.write_layer, src.write_pos]  # [b, writes, d]
        feats.index_add_(1, src.write_feat, (g_at * src.decoder_vecs).sum(-1))
        errors = (g_w * src.errors).sum(-1).reshape(b, -1)
        tokens = (g_tok * src.token_vectors).sum(-1)
        rows = torch.cat([feats, errors, tokens], 1).cpu()
        if out is None:
            return rows
        out.copy_(rows)
        return out


def row_engine(st: PromptState) -> TransposedRows | AutogradRows:
    """The hand-written transpose for the frozen (linear) replacement; autograd otherwise."""
    return TransposedRows(st) if st.freeze_norms else AutogradRows(st)


__all__ = ["AutogradRows", "TransposedRows", "biases", "row_engine", "row_width", "target_inputs"]
