"""The memory of one attribution graph at a prompt length (`ie_core.circuits`), before tracing.

The graph's nodes are circuit-tracer's: the kept transcoder features, one error node per
(layer, position), one token node per position and the logit targets
(`ie_core.circuits.graph.Graph`). Active features are `l0` per layer per position (the
transcoders' mean L0; the worked example's set averages 81, docs/notes/transcoders_smollm2.json).

What `attribute` and `prune` hold, from their code:
- the prompt's state, for the whole trace: per active feature its (layer, pos, feature) ids, its
  encoder column (d_model floats) and three scalars (`PromptState`); the forward's capture
  (`prompt_state.addresses`: four d_model rows and one attention map per layer and position) and
  the logits at every position;
- then the largest of three phases: under a `max_feature_nodes` cap, `_select` holds the kept
  features' rows (each spans every active feature's column), their concatenation and
  `partial_influence`'s |rows| and its normalised copy (4 row sets); the adjacency is then built
  beside the rows and one copy of them; `prune` holds 7 adjacencies at its peak (the adjacency,
  the kept adjacency, its normalised copy, the edge scores, the sort's values and int64 indices).
The backward passes' per-batch working tensors are not counted. Torch-free.
"""

from __future__ import annotations

from typing import Any

from ie_core.fit.items import Item

__all__ = ["DEFAULT_L0", "PRUNE_ADJACENCIES", "SELECT_ROW_SETS", "attribution_items", "node_count"]

DEFAULT_L0 = 81  # the worked example's trained set, mean over its 30 layers
PRUNE_ADJACENCIES = 7  # adjacency-sized fp32 buffers alive at pruning's peak (see above)
SELECT_ROW_SETS = 4  # row-set-sized buffers alive while `_select` ranks features
FP32 = 4
PER_FEATURE_SCALARS = 3 * 8 + 3 * 4  # int64 (layer, pos, feature); activation, bias, pre-act


def node_count(n_features: int, n_layers: int, n_pos: int, n_logits: int) -> int:
    """Nodes of a graph: features, errors (layers x positions), tokens, logit targets."""
    return n_features + n_layers * n_pos + n_pos + n_logits


def _state_bytes(shape: Any, tokens: int, active: int) -> int:
    features = active * (shape.d_model * FP32 + PER_FEATURE_SCALARS)
    per_layer = (4 * shape.d_model + shape.n_heads * tokens) * tokens * FP32
    return features + shape.n_layers * per_layer + tokens * shape.vocab * FP32


def attribution_items(
    shape: Any, tokens: int, l0: float, max_feature_nodes: int | None = None, n_logits: int = 10
) -> tuple[Item, ...]:
    """The prompt's state and the peak of the phases after it (see the module's docstring), on
    the host where the backward passes run (the CPU unless `ie trace --device` says otherwise)."""
    layers = shape.n_layers
    active = round(l0 * layers * tokens)
    kept = active if max_feature_nodes is None else min(max_feature_nodes, active)
    n = node_count(kept, layers, tokens, n_logits)
    adjacency = n * n * FP32
    rows = (kept + n_logits) * node_count(active, layers, tokens, 0) * FP32
    phases = {"pruning": PRUNE_ADJACENCIES * adjacency, "the adjacency": adjacency}
    if kept < active:
        phases["selecting features"] = SELECT_ROW_SETS * rows
        phases["the adjacency"] = 2 * rows + adjacency
    phase = max(phases, key=phases.__getitem__)
    remedy = "a shorter prompt, or a lower --max-feature-nodes"
    return (
        Item("attribution state", _state_bytes(shape, tokens, active),
             f"{tokens:,} tokens, L0 {l0:g}: {active:,} active features and the forward's "
             "capture", remedy),
        Item("attribution peak", phases[phase],
             f"{n:,} nodes ({kept:,} features); the largest phase: {phase}", remedy),
    )  # fmt: skip
