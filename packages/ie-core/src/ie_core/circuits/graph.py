"""The attribution graph: its node list and dense adjacency (rows are targets, columns sources).

Node order is circuit-tracer's (its `Graph` docstring): the selected active features, then one
error node per (layer, position) layer-major, one token node per position, then the logit
targets, most probable first. Only feature and logit nodes have incoming edges.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ie_core.fit.attribution import node_count

NODE_KINDS = ("feature", "error", "token", "logit")


@dataclass(frozen=True)
class LogitTarget:
    token_id: int
    token: str
    probability: float


@dataclass(frozen=True)
class Node:
    """One node: `layer` is -1 for tokens and n_layers for logits; `index` is the feature id, the
    token id (tokens) or the vocabulary id (logits), -1 for errors."""

    kind: str
    layer: int
    pos: int
    index: int
    activation: float | None = None  # features only
    probability: float | None = None  # logits only


@dataclass(frozen=True, eq=False)
class Graph:
    """Direct effects among one prompt's nodes through the frozen linear replacement.

    `adjacency[t, s]` is source s's direct effect on target t's input (a feature's
    pre-activation, a logit's value minus the mean logit); `node_inputs` holds those inputs from
    the model's own forward and `node_bias` the part no node carries (biases, position 0 when
    it was left out), so a target's row sums to its input less its bias; under a
    `max_feature_nodes` cap the left-out features' edges are missing from that sum."""

    prompt: str
    tokens: tuple[int, ...]
    token_strings: tuple[str, ...]
    n_layers: int
    active_features: torch.Tensor  # [n_active, 3] int64 (layer, pos, feature), every active one
    activation_values: torch.Tensor  # [n_active]
    selected_features: torch.Tensor  # [n_features] int64 indices into active_features
    logit_targets: tuple[LogitTarget, ...]
    adjacency: torch.Tensor  # [n_nodes, n_nodes]
    node_inputs: torch.Tensor  # [n_nodes] (0 for errors and tokens)
    node_bias: torch.Tensor  # [n_nodes]
    scan: str = ""

    @property
    def n_pos(self) -> int:
        return len(self.tokens)

    @property
    def n_features(self) -> int:
        return int(self.selected_features.numel())

    @property
    def n_nodes(self) -> int:
        return int(self.adjacency.shape[0])

    @property
    def error_offset(self) -> int:
        return self.n_features

    @property
    def token_offset(self) -> int:
        return self.n_features + self.n_layers * self.n_pos

    @property
    def logit_offset(self) -> int:
        return node_count(self.n_features, self.n_layers, self.n_pos, 0)  # `ie fit`'s count too

    @property
    def logit_probabilities(self) -> torch.Tensor:
        return torch.tensor([t.probability for t in self.logit_targets], dtype=torch.float32)

    def node(self, i: int) -> Node:
        """Node `i` of the adjacency's order."""
        if not 0 <= i < self.n_nodes:
            raise IndexError(f"node {i} is outside 0..{self.n_nodes - 1}")
        if i < self.error_offset:
            row = int(self.selected_features[i])
            layer, pos, feat = (int(v) for v in self.active_features[row])
            return Node("feature", layer, pos, feat, float(self.activation_values[row]))
        if i < self.token_offset:
            layer, pos = divmod(i - self.error_offset, self.n_pos)
            return Node("error", layer, pos, -1)
        if i < self.logit_offset:
            pos = i - self.token_offset
            return Node("token", -1, pos, self.tokens[pos])
        target = self.logit_targets[i - self.logit_offset]
        return Node(
            "logit", self.n_layers, self.n_pos - 1, target.token_id, probability=target.probability
        )

    def nodes(self) -> tuple[Node, ...]:
        return tuple(self.node(i) for i in range(self.n_nodes))


__all__ = ["NODE_KINDS", "Graph", "LogitTarget", "Node"]
