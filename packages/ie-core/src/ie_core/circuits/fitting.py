"""Thresholds under which a pruned graph fits the dashboard's graph page (`ie_core.graph_limits`).

`ie trace` writes what it is asked for; when that is over the page's limits it calls
`fitting_thresholds` and names the first (node, edge) pair, in the order below, whose graph JSON
fits (by bisection): the edge threshold lowered first (edges dominate the JSON: ~94 bytes each), then the node
threshold too. A candidate whose pruning keeps too many nodes or edges is passed over (the JSON
holds at most those); the others' JSON is built, so sizes and counts are measured.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ie_core.circuits.graph import Graph
from ie_core.circuits.graph_json import graph_json
from ie_core.circuits.pruning import prune
from ie_core.graph_limits import over_limits

__all__ = ["Fit", "candidates", "fitting_thresholds", "json_size"]

STEPS = (0.98, 0.95, 0.9, 0.85, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3)


@dataclass(frozen=True)
class Fit:
    node_threshold: float
    edge_threshold: float
    nodes: int
    links: int
    size: int  # bytes of the graph JSON

    def flags(self) -> str:
        return f"--node-threshold {self.node_threshold:g} --edge-threshold {self.edge_threshold:g}"


def candidates(node: float, edge: float) -> Iterator[tuple[float, float]]:
    """Pairs below the requested ones, keeping the most first: the edge threshold down the steps
    at the requested node threshold, then both down together."""
    for e in STEPS:
        if e < edge:
            yield node, e
    for n in STEPS:
        if n < node:
            yield n, min(n, edge)


def fitting_thresholds(graph: Graph, node: float, edge: float, **options: Any) -> Fit | None:
    """The first candidate pair whose graph JSON fits the page, or None (then only
    `--max-feature-nodes` or a shorter prompt helps). Found by bisection: along the candidates
    both thresholds only fall, so each keeps no more than the one before (a pruning of a
    10,000-node graph sorts 10^8 edge scores, seconds each); the answer is checked to fit."""
    pairs = list(candidates(node, edge))
    found: Fit | None = None
    lo, hi = 0, len(pairs) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        fit = _try(graph, *pairs[mid], **options)
        if fit is None:
            lo = mid + 1
        else:
            found, hi = fit, mid - 1
    return found


def _try(graph: Graph, node: float, edge: float, **options: Any) -> Fit | None:
    """The pair's Fit if its graph JSON is within the page's limits, else None."""
    kept = prune(graph, node_threshold=node, edge_threshold=edge)
    if over_limits(int(kept.node_mask.sum()), int(kept.edge_mask.sum()), 0):
        return None  # the JSON holds at most these
    data = graph_json(graph, pruned=kept, node_threshold=node, edge_threshold=edge, **options)
    fit = Fit(node, edge, len(data["nodes"]), len(data["links"]), json_size(data))
    return None if over_limits(fit.nodes, fit.links, fit.size) else fit


def json_size(data: Any) -> int:
    """Bytes of `data` as `write_graph_json` writes it."""
    return len(json.dumps(data, indent=1).encode())
