"""Which attention heads carry an edge of the attribution graph (the OV side).

The frozen replacement is linear in its source coefficients, so the part of an edge (source s ->
target t) that passes through head (l, h) is exact: `<dT/dz_lh, dz_lh/dc_s>`, summed over query
positions and the head's dims, where `z_lh` is the head's mixed values (the pattern times the
values, before `o_proj`) and `T` the target's input. The gradient comes from one backward pass
per target (an additive zero on every z), the tangent from one forward-mode product per source.
For each attention layer l, the edge equals the edge with layer l's heads held at their values
plus the sum of `flows[l]`; a path through two heads counts in both layers, so flows of
different layers do not add up to the edge.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.func import jvp, vmap

from ie_core.circuits import replacement
from ie_core.circuits.errors import AttributionInputError
from ie_core.circuits.graph import Graph
from ie_core.circuits.graph_json import node_json
from ie_core.circuits.prompt_state import PromptState
from ie_core.circuits.replacement import Trunk, mlp_writes


def trunk(
    st: PromptState,
    token_part: torch.Tensor,
    writes: torch.Tensor,
    z_add: Sequence[torch.Tensor] | None = None,
    stop: int | None = None,
) -> Trunk:
    """The replacement's `trunk` of one prompt's state."""
    return replacement.trunk(
        st.weights, st.frozen, st.sources, token_part, writes, freeze_norms=st.freeze_norms,
        z_add=z_add, stop=stop,
    )  # fmt: skip


def prompt_inputs(st: PromptState) -> tuple[torch.Tensor, torch.Tensor]:
    """What the token nodes and the MLPs put into the residual at this prompt (coefficients 1)."""
    n_feat = st.active_features.shape[0]
    dev = st.sources.token_vectors.device
    writes = mlp_writes(
        st.sources, torch.ones(n_feat, device=dev), torch.ones(st.n_layers, st.n_pos, device=dev)
    )
    return st.sources.token_vectors.clone(), writes


def source_direction(st: PromptState, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Source `i`'s write (state order: active features, errors layer-major, tokens) as tangents
    of `(token_part, writes)`: the change of the trunk's inputs per unit of its coefficient."""
    src, n_feat = st.sources, st.active_features.shape[0]
    tok = torch.zeros_like(src.token_vectors)
    writes = torch.zeros_like(src.errors)
    if i < n_feat:
        mine = src.write_feat == i  # a CLT feature writes at several layers
        writes.index_put_(
            (src.write_layer[mine], src.write_pos[mine]), src.decoder_vecs[mine], accumulate=True
        )
    elif i < n_feat + st.n_layers * st.n_pos:
        layer, pos = divmod(i - n_feat, st.n_pos)
        writes[layer, pos] = src.errors[layer, pos]
    else:
        pos = i - n_feat - st.n_layers * st.n_pos
        tok[pos] = src.token_vectors[pos]
    return tok, writes


def per_source(st: PromptState, g_tok: torch.Tensor, g_w: torch.Tensor) -> torch.Tensor:
    """A gradient at `(token_part, writes)` contracted with every source's write `[n_sources]`,
    in state order (each source's share of the scalar the gradient is of, the trunk being
    linear)."""
    src = st.sources
    feats = torch.zeros(st.active_features.shape[0], device=g_w.device)
    part = (g_w[src.write_layer, src.write_pos] * src.decoder_vecs).sum(-1)
    feats.index_add_(0, src.write_feat, part)
    errors = (g_w * src.errors).sum(-1).reshape(-1)
    return torch.cat([feats, errors, (g_tok * src.token_vectors).sum(-1)])


def _check_graph(st: PromptState, graph: Graph) -> None:
    if graph.tokens != st.tokens or graph.n_layers != st.n_layers:
        raise AttributionInputError(
            "the graph is not this state's (other tokens or layers); pass the PromptState the "
            "graph was built from (prepare(), then attribute_state())"
        )


def graph_source(st: PromptState, graph: Graph, node: int) -> int:
    """The state's source index (features, errors, tokens) of graph node `node`."""
    _check_graph(st, graph)
    kind = graph.node(node).kind
    if kind == "logit":
        raise AttributionInputError(f"node {node} is a logit, which has no outgoing edges")
    if kind == "feature":
        return int(graph.selected_features[node])
    return st.active_features.shape[0] + node - graph.error_offset


def graph_target(st: PromptState, graph: Graph, node: int) -> int:
    """The state's target index (features, then logits, as `_Rows`) of graph node `node`."""
    _check_graph(st, graph)
    kind = graph.node(node).kind
    if kind == "feature":
        return int(graph.selected_features[node])
    if kind == "logit":
        return st.active_features.shape[0] + node - graph.logit_offset
    raise AttributionInputError(f"node {node} is a {kind} node, which has no incoming edges")


def _readouts(st: PromptState, out: Trunk, targets: Sequence[int]) -> torch.Tensor:
    """Each target's input (a feature's pre-activation less b_enc, a logit's demeaned value
    less the unembed bias) from the trunk's outputs: one scalar per target."""
    n_feat = st.active_features.shape[0]
    assert out.final is not None  # a full walk (no `stop`)
    vals = []
    for t in targets:
        if t < n_feat:
            layer, pos, _ = (int(v) for v in st.active_features[t])
            vals.append(out.mlp_in[layer][pos] @ st.encoder_vecs[t])
        else:
            vals.append(out.final[-1] @ st.unembed_dirs[t - n_feat])
    return torch.stack(vals)


class HeadFlows:
    """Head flows of a state's edges: target gradients at every head's z and source tangents of
    every z are computed once each and cached, so many edges cost one backward per target and
    one forward-mode product per source."""

    def __init__(self, st: PromptState) -> None:
        self.st = st
        self.inputs = prompt_inputs(st)
        self._grads: dict[int, tuple[torch.Tensor, ...]] = {}
        self._tangents: dict[int, tuple[torch.Tensor, ...]] = {}

    def _target_grads(self, targets: list[int]) -> None:
        todo = [t for t in dict.fromkeys(targets) if t not in self._grads]
        if not todo:
            return
        st = self.st
        z_add = [
            torch.zeros(st.n_pos, lw.n_heads, lw.head_dim, requires_grad=True)
            for lw in st.weights.layers
        ]
        out = trunk(st, *self.inputs, z_add=z_add)
        vals = _readouts(st, out, todo)
        eye = torch.eye(len(todo))
        grads = torch.autograd.grad(
            vals, z_add, eye, is_grads_batched=True, allow_unused=True, materialize_grads=True
        )
        for k, t in enumerate(todo):
            self._grads[t] = tuple(g[k] if g.dim() == 4 else g for g in grads)

    def _source_tangents(self, sources: list[int]) -> None:
        todo = [s for s in dict.fromkeys(sources) if s not in self._tangents]
        if not todo:
            return
        dirs = [source_direction(self.st, s) for s in todo]
        tan_tok = torch.stack([d[0] for d in dirs])
        tan_w = torch.stack([d[1] for d in dirs])

        def z_of(tok: torch.Tensor, writes: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return trunk(self.st, tok, writes).z

        def tangent(tt: torch.Tensor, tw: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return jvp(z_of, self.inputs, (tt, tw))[1]

        zs = vmap(tangent)(tan_tok, tan_w)
        for k, s in enumerate(todo):
            self._tangents[s] = tuple(z[k] for z in zs)

    def flows(self, pairs: Sequence[tuple[int, int]]) -> torch.Tensor:
        """Flows `[len(pairs), n_layers, n_heads]` of edges given as (source, target) in state
        indices (sources: features, errors, tokens; targets: features, then logits)."""
        self._target_grads([t for _, t in pairs])
        self._source_tangents([s for s, _ in pairs])
        rows = []
        for s, t in pairs:
            g, dz = self._grads[t], self._tangents[s]
            rows.append(torch.stack([(a * b).sum((0, 2)) for a, b in zip(g, dz, strict=True)]))
        if not rows:
            return torch.zeros(0, self.st.n_layers, self.st.weights.layers[0].n_heads)
        return torch.stack(rows).detach()

    def graph_flows(self, graph: Graph, pairs: Sequence[tuple[int, int]]) -> torch.Tensor:
        """`flows` of edges given as (source node, target node) of `graph` (built from this
        state), i.e. of `graph.adjacency[target, source]`."""
        st = self.st
        return self.flows(
            [(graph_source(st, graph, s), graph_target(st, graph, t)) for s, t in pairs]
        )


def head_flows(st: PromptState, graph: Graph, source: int, target: int) -> torch.Tensor:
    """How much of edge `graph.adjacency[target, source]` passes through each attention head:
    `[n_layers, n_heads]`. For every layer l, `flows[l].sum()` plus the edge with layer l's
    heads held fixed is the edge; heads a path cannot reach (layers at or before the source's,
    after the target's read) give 0."""
    return HeadFlows(st).graph_flows(graph, [(source, target)])[0]


def top_edge_heads(
    st: PromptState,
    graph: Graph,
    n_edges: int = 20,
    n_heads: int = 5,
    edge_mask: torch.Tensor | None = None,
) -> list[dict[str, Any]]:
    """The `n_edges` largest edges between nodes at different positions (among `edge_mask`'s,
    e.g. a pruned graph's), each with its `n_heads` largest head flows: a JSON-ready list of
    `{source, target, weight, heads: [{layer, head, flow}]}` in graph node ids."""
    a = graph.adjacency.clone()
    if edge_mask is not None:
        a[~edge_mask] = 0
    pos = torch.tensor([n.pos for n in graph.nodes()])
    a[pos[:, None] == pos[None, :]] = 0  # same-position edges need no head
    k = min(n_edges, int((a != 0).sum()))
    top = torch.topk(a.abs().flatten(), k).indices.tolist()
    pairs = [(i % a.shape[1], i // a.shape[1]) for i in top]
    out: list[dict[str, Any]] = []
    for (s, t), f in zip(pairs, HeadFlows(st).graph_flows(graph, pairs), strict=True):
        flat = f.flatten()
        best = torch.topk(flat.abs(), min(n_heads, flat.numel())).indices.tolist()
        heads = [
            {"layer": i // f.shape[1], "head": i % f.shape[1], "flow": float(flat[i])} for i in best
        ]
        weight = float(graph.adjacency[t, s])
        out.append({"source": s, "target": t, "weight": weight, "heads": heads})
    return out


def heads_json(
    st: PromptState, graph: Graph, n_edges: int, edge_mask: torch.Tensor | None = None
) -> list[dict[str, Any]]:
    """`top_edge_heads` with the graph JSON's node ids (`ie trace --heads`): the viewers read
    `nodes` and `links` and leave this extra key alone."""

    def nid(i: int) -> str:
        return node_json(graph, graph.node(i), 0.0, i - graph.logit_offset)["node_id"]

    edges = top_edge_heads(st, graph, n_edges, edge_mask=edge_mask)
    return [e | {"source": nid(e["source"]), "target": nid(e["target"])} for e in edges]


__all__ = [
    "HeadFlows",
    "Trunk",
    "graph_source",
    "graph_target",
    "head_flows",
    "heads_json",
    "per_source",
    "prompt_inputs",
    "source_direction",
    "top_edge_heads",
    "trunk",
]
