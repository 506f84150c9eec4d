"""The graph as the JSON that circuit-tracer's local viewer and Neuronpedia's graph page read.

Field names and node ids follow circuit-tracer 0.5.0 (`frontend/graph_models.py`,
`utils/create_graph_files.py`): `metadata` (slug, scan, transcoder_list, prompt_tokens, prompt,
node_threshold, schema_version), `qParams`, `nodes` (node_id, feature, layer, ctx_idx,
feature_type, token_prob, is_target_logit, run_idx, reverse_ctx_idx, jsNodeId, clerp, influence,
activation) and `links` (source, target, weight), over the pruned graph. Its ids are kept as
it writes them, although an error node's `0_{layer}_{pos}` can equal a layer-0 feature's
`{layer}_{feature}_{pos}` (feature 3 at position 5 and the layer-3 error at position 5).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ie_core.circuits.graph import Graph, Node
from ie_core.circuits.pruning import Pruned, prune


def _cantor(x: int, y: int) -> int:
    """The viewer's feature key for (layer, feature): the Cantor pairing of the two."""
    return (x + y) * (x + y + 1) // 2 + y


def node_json(graph: Graph, node: Node, influence: float, rank: int) -> dict[str, Any]:
    base: dict[str, Any] = {
        "token_prob": 0.0, "is_target_logit": False, "run_idx": 0, "reverse_ctx_idx": 0,
        "clerp": "", "influence": influence, "activation": None, "ctx_idx": node.pos,
    }  # fmt: skip
    if node.kind == "feature":
        nid = f"{node.layer}_{node.index}_{node.pos}"
        return base | {
            "node_id": nid, "feature": _cantor(node.layer, node.index), "layer": str(node.layer),
            "feature_type": "cross layer transcoder", "jsNodeId": f"{node.layer}_{node.index}-0",
            "activation": node.activation,
        }  # fmt: skip
    if node.kind == "error":
        return base | {
            "node_id": f"0_{node.layer}_{node.pos}", "feature": -1, "layer": str(node.layer),
            "feature_type": "mlp reconstruction error", "jsNodeId": f"{node.layer}_{node.pos}-0",
        }  # fmt: skip
    if node.kind == "token":
        return base | {
            "node_id": f"E_{node.index}_{node.pos}", "feature": node.pos, "layer": "E",
            "feature_type": "embedding", "jsNodeId": f"E_{node.index}-{node.pos}",
        }  # fmt: skip
    layer = str(graph.n_layers + 1)
    p = float(node.probability or 0.0)
    token = graph.logit_targets[rank].token
    return base | {
        "node_id": f"{layer}_{node.index}_{node.pos}", "feature": node.index, "layer": layer,
        "feature_type": "logit", "token_prob": p, "is_target_logit": rank == 0,
        "jsNodeId": f"L_{node.index}-{node.pos}", "clerp": f'Output "{token}" (p={p:.3f})',
        "influence": None,
    }  # fmt: skip


def graph_json(
    graph: Graph,
    *,
    slug: str = "graph",
    scan: str | None = None,
    node_threshold: float = 0.8,
    edge_threshold: float = 0.98,
    pruned: Pruned | None = None,
    transcoder_kind: str | None = None,
) -> dict[str, Any]:
    """The viewer's JSON of `graph` pruned at these thresholds (or by `pruned`). circuit-tracer
    types every feature "cross layer transcoder"; `transcoder_kind` ("per-layer transcoder" or
    "cross-layer transcoder", `transcoder_kind_of(set)`) records the set's kind in the metadata
    for viewers that read it (the dashboard)."""
    pruned = pruned or prune(graph, node_threshold, edge_threshold)
    keep = pruned.node_mask.nonzero()[:, 0].tolist()
    made = {
        i: node_json(graph, graph.node(i), float(pruned.cumulative[i]), i - graph.logit_offset)
        for i in keep
    }
    dst, src = pruned.edge_mask.nonzero().unbind(1)
    links = [
        {
            "source": made[s]["node_id"],
            "target": made[t]["node_id"],
            "weight": float(graph.adjacency[t, s]),
        }
        for t, s in zip(dst.tolist(), src.tolist(), strict=True)
        if s in made and t in made
    ]
    linked = {x for link in links for x in (link["source"], link["target"])}
    nodes = [
        n
        for n in made.values()
        if n["node_id"] in linked or n["feature_type"] in ("embedding", "logit")
    ]
    metadata = {
        "slug": slug, "scan": scan if scan is not None else graph.scan, "transcoder_list": [],
        "prompt_tokens": list(graph.token_strings), "prompt": graph.prompt,
        "node_threshold": node_threshold, "schema_version": 1,
    }  # fmt: skip
    if transcoder_kind is not None:
        metadata["transcoder_kind"] = transcoder_kind
    qparams = {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "", "sg_pos": ""}
    return {"metadata": metadata, "qParams": qparams, "nodes": nodes, "links": links}


def write_graph_json(graph: Graph, path: str | Path, **options: Any) -> Path:
    """Write `graph_json(graph, **options)` to `path` (slug: the file's stem by default)."""
    path = Path(path)
    options.setdefault("slug", path.stem)
    path.write_text(json.dumps(graph_json(graph, **options), indent=1))
    return path


def transcoder_kind_of(transcoders: Any) -> str:
    """The metadata's `transcoder_kind` of a TranscoderSet."""
    return "cross-layer transcoder" if transcoders.is_cross_layer else "per-layer transcoder"


__all__ = ["graph_json", "node_json", "transcoder_kind_of", "write_graph_json"]
