"""`attribute(model, prompt, transcoders)`: one captured forward on the model's own backend, then
batched backward passes through the frozen linear replacement for the rows of the graph.

A row is the gradient of one target's input (a feature's pre-activation, a logit target's
demeaned logit) with respect to every source coefficient, so rows come straight out of
`torch.autograd.grad` with a batch of one-hot output weights. Features are taken in order of
their influence on the logits when `max_feature_nodes` caps them (circuit-tracer's scheme).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ie_core import run_with_cache
from ie_core.circuits.errors import AttributionInputError
from ie_core.circuits.graph import Graph
from ie_core.circuits.influence import partial_influence
from ie_core.circuits.prompt_state import (
    PromptState,
    addresses,
    build_state,
    check_prompt,
    logit_targets,
    moved,
    unembed,
)
from ie_core.circuits.replacement import mlp_writes, run_at, run_replacement
from ie_core.circuits.sources import load_transcoders
from ie_core.circuits.transcoders import TranscoderSet
from ie_core.circuits.weights import ReplacementWeights, weights_for
from ie_core.sync import unwrap


def _check_knobs(max_feature_nodes: int | None, max_n_logits: int, prob: float, batch: int) -> None:
    if max_feature_nodes is not None and max_feature_nodes < 0:
        raise AttributionInputError(f"max_feature_nodes is {max_feature_nodes}; give >= 0 or None")
    if max_n_logits < 1:
        raise AttributionInputError(f"max_n_logits is {max_n_logits}; give at least 1")
    if not 0.0 < prob <= 1.0:
        raise AttributionInputError(f"desired_logit_prob is {prob}; give a value in (0, 1]")
    if batch < 1:
        raise AttributionInputError(f"batch_size is {batch}; give at least 1")


def prepare(
    model: Any,
    prompt: str | Sequence[int],
    transcoders: TranscoderSet | str | Path | Sequence[Any],
    *,
    max_n_logits: int = 10,
    desired_logit_prob: float = 0.95,
    zero_first_position: bool = True,
    weights: ReplacementWeights | str | Path | None = None,
) -> PromptState:
    """The forward half: checks, one capture through `run_with_cache`, the frozen constants."""

    inner = unwrap(model)
    ts = load_transcoders(transcoders)
    ts.check(inner.n_layers, inner.d_model)  # widths and layers before any forward
    w = weights_for(inner, weights)
    tokens = inner.to_tokens(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
    check_prompt(tokens, getattr(inner, "max_positions", None))
    cache = run_with_cache(model, [tokens], addresses(inner.n_layers))
    logits = unembed(w, cache["final_norm"][0, -1].detach().float().cpu())
    targets = logit_targets(logits, max_n_logits, desired_logit_prob, inner.to_string)
    return build_state(tokens, cache, ts, w, targets, zero_first=zero_first_position)


class _Rows:
    """The replacement's forward with its autograd graph kept. `rows(ids)` runs one batched
    backward pass from the chosen targets' read-out vectors (a feature's encoder column at its
    `mlp_in` row, a logit's demeaned unembed row at the final norm's last row) to the residual
    writes, and contracts the gradients with each source's write vector."""

    def __init__(self, st: PromptState) -> None:
        src = st.sources
        n_feat = st.active_features.shape[0]
        dev = self.device = st.sources.token_vectors.device
        ones = (torch.ones(n_feat, device=dev), torch.ones(st.n_layers, st.n_pos, device=dev))
        self.token_part = src.token_vectors.clone().requires_grad_(True)
        self.writes = mlp_writes(src, *ones).requires_grad_(True)
        out = run_replacement(
            st.weights, st.frozen, src, self.token_part, self.writes, freeze_norms=st.freeze_norms
        )
        self.layers_out, self.final = out.mlp_in_layers, out.final
        with torch.no_grad():
            zeros = tuple(torch.zeros_like(t) for t in (*ones, ones[1][0]))
            off = run_at(st.weights, st.frozen, src, *zeros, freeze_norms=st.freeze_norms)
            self.bias = _target_inputs(st, off.mlp_in, off.final).cpu()
        self.st = st
        # Writes sorted by (layer, pos): one [B, d] x [d, n] product per (layer, pos) group.
        keys = src.write_layer * st.n_pos + src.write_pos
        edges = torch.arange(st.n_layers * st.n_pos + 1, device=keys.device)
        bounds = torch.searchsorted(keys, edges).tolist()
        self.groups = [
            (k // st.n_pos, k % st.n_pos, bounds[k], bounds[k + 1])
            for k in range(st.n_layers * st.n_pos)
            if bounds[k + 1] > bounds[k]
        ]

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `[len(ids), n_feat + errors + tokens]` of targets `ids`, on the CPU."""
        st, dev = self.st, self.device
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
        # Start the backward pass at the highest layer a target reads (all layers for a logit).
        top = int(st.active_features[fi, 0].max()) + 1 if len(fi) else 0
        outs, cots = list(self.layers_out[:top]), list(g_in[:, :top].unbind(1))
        if len(fi) < b:
            outs, cots = [*outs, self.final], [*cots, g_final]
        g_tok, g_w = torch.autograd.grad(
            outs, (self.token_part, self.writes), cots, retain_graph=True,
            is_grads_batched=True, allow_unused=True, materialize_grads=True,
        )  # fmt: skip
        if g_w.dim() == self.writes.dim():  # unused (layer-0 targets): materialised unbatched
            g_w = g_w.expand(b, *g_w.shape)
        src = st.sources
        feats = torch.zeros(b, n_feat, device=dev)
        for layer, pos, lo, hi in self.groups:
            # A CLT feature's writes at several layers add up into its one column.
            part = g_w[:, layer, pos] @ src.decoder_vecs[lo:hi].T
            feats.index_add_(1, src.write_feat[lo:hi], part)
        errors = (g_w * src.errors).sum(-1).reshape(b, -1)
        tokens = (g_tok * src.token_vectors).sum(-1)
        return torch.cat([feats, errors, tokens], 1).cpu()


def _target_inputs(st: PromptState, mlp_in: torch.Tensor, final: torch.Tensor) -> torch.Tensor:
    """Every active feature's pre-activation, then every logit target's demeaned logit."""
    f_layer, f_pos, _ = st.active_features.unbind(1)
    feats = (mlp_in[f_layer, f_pos] * st.encoder_vecs).sum(-1) + st.encoder_bias
    logits = st.unembed_dirs @ final[-1] + st.unembed_bias
    return torch.cat([feats, logits])


def _select(
    rows: _Rows, st: PromptState, limit: int, batch: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Feature rows up to `limit`, most influential first: (selected ids ascending, their rows)."""
    n_feat = st.active_features.shape[0]
    n_logit = len(st.logit_targets)
    width = n_feat + (st.n_layers + 1) * st.n_pos  # features, errors, tokens
    logit_rows = rows.rows(torch.arange(n_feat, n_feat + n_logit))
    done: dict[int, torch.Tensor] = {}
    probs = torch.tensor([t.probability for t in st.logit_targets], dtype=torch.float32)
    while len(done) < limit:
        if limit == n_feat:
            pending = [i for i in range(n_feat) if i not in done]
        else:
            known = sorted(done)
            table = torch.cat([logit_rows, *(done[i][None] for i in known)])
            nodes = torch.tensor([-1] * n_logit + known, dtype=torch.long)
            weights = torch.cat([probs, torch.zeros(len(known))])
            score = partial_influence(table, nodes, weights)[:n_feat]
            order = [int(i) for i in torch.argsort(score, descending=True) if int(i) not in done]
            pending = order[: min(4 * batch, limit - len(done))]  # re-rank every 4 batches
        for start in range(0, len(pending), batch):
            ids = torch.tensor(pending[start : start + batch], dtype=torch.long)
            for i, row in zip(ids.tolist(), rows.rows(ids), strict=True):
                done[i] = row
    selected = torch.tensor(sorted(done), dtype=torch.long)
    feature_rows = [done[i] for i in selected.tolist()]
    return selected, torch.cat(
        [torch.zeros(0, width), *(r[None] for r in feature_rows), logit_rows]
    )


def attribute_state(
    st: PromptState, *, max_feature_nodes: int | None = None, batch_size: int = 256,
    prompt: str = "", token_strings: tuple[str, ...] = (), scan: str = "",
    device: torch.device | str | None = None,
) -> Graph:  # fmt: skip
    """The backward half: the graph's rows through the frozen replacement of `st`, computed on
    `device` (default: the CPU); the graph's tensors are on the CPU."""
    rows = _Rows(st if device is None else moved(st, device))
    n_feat = st.active_features.shape[0]
    limit = n_feat if max_feature_nodes is None else min(max_feature_nodes, n_feat)
    selected, table = _select(rows, st, limit, batch_size)
    # Columns: the selected features, then every error and token node (the row layout's tail).
    cols = torch.cat([selected, torch.arange(n_feat, table.shape[1])])
    table = table[:, cols]
    n_nodes = table.shape[1] + len(st.logit_targets)
    adjacency = torch.zeros(n_nodes, n_nodes)
    n_sel = len(selected)
    adjacency[:n_sel, : table.shape[1]] = table[:n_sel]
    adjacency[table.shape[1] :, : table.shape[1]] = table[n_sel:]
    inputs, bias = torch.zeros(n_nodes), torch.zeros(n_nodes)
    target_ids = torch.cat([selected, torch.arange(n_feat, n_feat + len(st.logit_targets))])
    where = torch.cat([torch.arange(n_sel), torch.arange(table.shape[1], n_nodes)])
    inputs[where] = torch.cat([st.pre_activations[selected], st.demeaned_logits])
    bias[where] = rows.bias.detach()[target_ids]
    return Graph(
        prompt=prompt,
        tokens=st.tokens,
        token_strings=token_strings,
        n_layers=st.n_layers,
        active_features=st.active_features,
        activation_values=st.activation_values,
        selected_features=selected,
        logit_targets=st.logit_targets,
        adjacency=adjacency,
        node_inputs=inputs,
        node_bias=bias,
        scan=scan,
    )


def attribute(
    model: Any,
    prompt: str | Sequence[int],
    transcoders: TranscoderSet | str | Path | Sequence[Any],
    *,
    max_feature_nodes: int | None = None,
    max_n_logits: int = 10,
    desired_logit_prob: float = 0.95,
    batch_size: int = 256,
    zero_first_position: bool = True,
    weights: ReplacementWeights | str | Path | None = None,
    device: torch.device | str | None = None,
) -> Graph:
    """The attribution graph of `prompt`'s next-token prediction through `transcoders`.

    The forward runs on `model`'s backend through its capture API; the backward passes run on
    the CPU through the frozen linear replacement (patterns and norm scales at this prompt's
    values). `max_feature_nodes` caps feature nodes (most influential first); logit targets are
    the fewest top tokens reaching `desired_logit_prob` (at most `max_n_logits`);
    `zero_first_position` leaves position 0's features and error out of the graph as
    circuit-tracer does (its MLP output then counts as bias); `weights` is the model's HF folder
    where the backend keeps weights in other processes; `device` is where the backward passes
    run (default: the CPU; e.g. "cuda" for large models)."""

    _check_knobs(max_feature_nodes, max_n_logits, desired_logit_prob, batch_size)
    ts = load_transcoders(transcoders)
    st = prepare(
        model, prompt, ts, max_n_logits=max_n_logits, desired_logit_prob=desired_logit_prob,
        zero_first_position=zero_first_position, weights=weights,
    )  # fmt: skip
    inner = unwrap(model)
    strings = tuple(inner.to_string([t]) for t in st.tokens)
    text = prompt if isinstance(prompt, str) else inner.to_string(list(st.tokens))
    return attribute_state(
        st, max_feature_nodes=max_feature_nodes, batch_size=batch_size, prompt=text,
        token_strings=strings, scan=ts.scan, device=device,
    )  # fmt: skip


__all__ = ["attribute", "attribute_state", "prepare"]
