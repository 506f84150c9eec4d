"""The memory of one attribution graph at a prompt length (`ie_core.circuits`), before tracing.

The graph's nodes are circuit-tracer's: every active transcoder feature, one error node per
(layer, position), one token node per position and the logit targets
(`ie_core.circuits.graph.Graph`). Active features are `l0` per layer per position (the
transcoders' mean L0; the worked example's set averages 81, docs/notes/transcoders_smollm2.json).
`attribute` holds the dense fp32 adjacency, nodes x nodes; `prune` holds, at its peak (the sort
of the edge scores in `pruning._cut`), the adjacency, the kept adjacency, its normalised copy,
the edge scores and the sort's values and int64 indices: 7 adjacencies in all. Torch-free.
"""

from __future__ import annotations

from ie_core.fit.items import Item

__all__ = ["DEFAULT_L0", "PRUNE_ADJACENCIES", "attribution_items", "node_count"]

DEFAULT_L0 = 81  # the worked example's trained set, mean over its 30 layers
PRUNE_ADJACENCIES = 7  # adjacency-sized fp32 buffers alive at pruning's peak (see above)
FP32 = 4


def node_count(n_features: int, n_layers: int, n_pos: int, n_logits: int) -> int:
    """Nodes of a graph: features, errors (layers x positions), tokens, logit targets."""
    return n_features + n_layers * n_pos + n_pos + n_logits


def attribution_items(
    n_layers: int, tokens: int, l0: float, max_feature_nodes: int | None = None,
    n_logits: int = 10,
) -> tuple[Item, ...]:  # fmt: skip
    """The adjacency `attribute` returns, the rows it holds while selecting features under a
    `max_feature_nodes` cap, and the further buffers of its pruning; on the host, where the
    backward passes run (the CPU unless `ie trace --device` says otherwise)."""
    active = round(l0 * n_layers * tokens)
    kept = active if max_feature_nodes is None else min(max_feature_nodes, active)
    n = node_count(kept, n_layers, tokens, n_logits)
    adjacency = n * n * FP32
    where = f"{tokens:,} tokens, L0 {l0:g}: {active:,} active features, {n:,} nodes"
    remedy = "a shorter prompt, or a lower --max-feature-nodes"
    items = [Item("attribution graph", adjacency, f"{where}; fp32 nodes^2 x 4 B", remedy)]
    if kept < active:  # `_select`: each selected row spans every active feature's column
        width = node_count(active, n_layers, tokens, 0)
        rows = (kept + n_logits) * width * FP32
        items.append(Item("attribution rows", rows, f"{kept + n_logits:,} rows x {width:,} "
                          "columns x 4 B while selecting features", remedy))  # fmt: skip
    items.append(Item(
        "attribution pruning", (PRUNE_ADJACENCIES - 1) * adjacency,
        f"{PRUNE_ADJACENCIES - 1} more adjacency-sized buffers at prune's peak", remedy,
    ))  # fmt: skip
    return tuple(items)
