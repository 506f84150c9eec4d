"""Pruning a graph to the nodes and edges that carry most of its influence on the logits
(Ameisen et al. 2025, "Circuit Tracing"; circuit-tracer's defaults: keep the nodes holding 80%
of the influence, then the edges holding 98%). Token and logit nodes are always kept; a feature
or error left without a kept outgoing edge, or a feature without a kept incoming one, is dropped,
repeatedly until nothing changes."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ie_core.circuits.errors import AttributionInputError
from ie_core.circuits.graph import Graph
from ie_core.circuits.influence import normalized, normalized_, path_influence


@dataclass(frozen=True)
class Pruned:
    """`node_mask` `[n_nodes]`, `edge_mask` `[n_nodes, n_nodes]` (as the adjacency), and each
    node's cumulative influence share (the fraction of all influence held by nodes at least as
    influential: 0.8 is the node threshold's edge)."""

    node_mask: torch.Tensor
    edge_mask: torch.Tensor
    cumulative: torch.Tensor


def _descending(scores: torch.Tensor) -> torch.Tensor:
    """`scores`' values, flattened and sorted largest first: numpy sorts values in place, where
    `torch.sort` would also hold int64 indices (two more buffers of the scores' size)."""
    ordered = scores.flatten().neg().numpy()
    ordered.sort()
    return torch.from_numpy(ordered).neg_()


def _cut(scores: torch.Tensor, keep: float) -> torch.Tensor:
    """The smallest score among the top scores holding a `keep` share of their total."""
    ordered = _descending(scores)
    share = torch.cumsum(ordered, 0).div_(ordered.sum().clamp_min(1e-30))
    at = min(
        int(torch.searchsorted(share, torch.tensor(keep, dtype=share.dtype))), len(ordered) - 1
    )
    return ordered[at]


def _check(name: str, value: float) -> None:
    if not isinstance(value, int | float) or not 0.0 <= float(value) <= 1.0:
        raise AttributionInputError(
            f"{name} is {value!r}: it is a share of the total influence, in [0, 1] "
            "(circuit-tracer's defaults: node 0.8, edge 0.98)"
        )


def check_thresholds(node_threshold: float, edge_threshold: float) -> None:
    """Refuse shares outside [0, 1] (before any work, so a command fails before its load)."""
    _check("node_threshold", node_threshold)
    _check("edge_threshold", edge_threshold)


def prune(graph: Graph, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> Pruned:
    """The kept nodes and edges of `graph` at these influence shares."""
    check_thresholds(node_threshold, edge_threshold)
    adj = graph.adjacency.float()
    n, n_feat, fixed = graph.n_nodes, graph.n_features, graph.token_offset
    logit_w = torch.zeros(n)
    logit_w[graph.logit_offset :] = graph.logit_probabilities
    influence = path_influence(normalized(adj), logit_w)
    nodes = influence >= _cut(influence, node_threshold)
    nodes[fixed:] = True
    # One adjacency-sized buffer: the kept adjacency, normalised, then scaled into edge scores.
    a = normalized_((adj * nodes[:, None]).mul_(nodes[None, :]))
    edge_scores = a.mul_((path_influence(a, logit_w) + logit_w)[:, None])
    edges = edge_scores >= _cut(edge_scores, edge_threshold)
    del a, edge_scores
    while True:
        edges &= nodes[:, None] & nodes[None, :]
        before = nodes.clone()
        nodes[:fixed] &= edges[:, :fixed].any(0)  # features and errors need an outgoing edge
        nodes[:n_feat] &= edges[:n_feat].any(1)  # features need an incoming one
        if torch.equal(nodes, before):
            break
    order = torch.argsort(influence, descending=True)
    cumulative = torch.zeros(n)
    cumulative[order] = torch.cumsum(influence[order], 0) / influence.sum().clamp_min(1e-30)
    return Pruned(nodes, edges, cumulative)


__all__ = ["Pruned", "check_thresholds", "prune"]
