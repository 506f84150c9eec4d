"""Attribution graphs (`ie trace`'s JSON, circuit-tracer's viewer format): checks and drawing.

`check_graph` turns parsed JSON into a `GraphDoc` or raises `GraphError` naming the first
problem, so a malformed graph is refused whole (nothing stored) with its reason. `layout` places
the nodes by layer (rows: tokens at the bottom, logits on top) and prompt position (columns) and
scales each edge's stroke by |weight|, as plain SVG geometry the template draws.

circuit-tracer's JSON names things its own way, which the page translates: every feature's
`feature_type` is "cross layer transcoder" whatever the set (`ie trace` records the set's kind in
`metadata.transcoder_kind`), and logits sit at layer n_layers + 1 (31 on a 30-layer model, whose
layers are 0-29); an error node's id is `0_{layer}_{pos}`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ie_core.graph_limits import MAX_GRAPH_LINKS, MAX_GRAPH_NODES, THRESHOLD_FLAGS

# A pruned graph of a real prompt holds hundreds of nodes and a few thousand edges; these bounds
# keep one page's SVG drawable (and its stored JSON well under the 20 MiB body limit). They live
# in ie-core so `ie trace` can say which thresholds bring a graph under them.
MAX_NODES = MAX_GRAPH_NODES
MAX_LINKS = MAX_GRAPH_LINKS
# What a refusal for size says to do about it.
SMALLER = (
    f"rerun {THRESHOLD_FLAGS} lower (it prints thresholds that fit when the graph it writes is "
    "over these limits)"
)
# Edges drawn on the page, strongest first; the table and the API keep them all.
MAX_DRAWN_LINKS = 2_000


TRANSCODER_KINDS = ("per-layer transcoder", "cross-layer transcoder")


class GraphError(ValueError):
    """A graph refused at ingest; `status` is the HTTP code (400 malformed, 413 too large)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message, self.status = message, status


@dataclass(frozen=True)
class GraphNode:
    node_id: str
    layer: str  # "E" (token embedding), a layer number, or n_layers + 1 for logits
    pos: int
    kind: str  # circuit-tracer's feature_type
    feature: int | None
    influence: float | None
    activation: float | None
    clerp: str
    token_prob: float


@dataclass(frozen=True)
class GraphLink:
    source: str
    target: str
    weight: float


@dataclass(frozen=True)
class GraphDoc:
    slug: str
    scan: str
    prompt: str
    prompt_tokens: tuple[str, ...]
    node_threshold: float | None
    nodes: tuple[GraphNode, ...]
    links: tuple[GraphLink, ...]
    transcoder_kind: str = ""  # "per-layer transcoder" / "cross-layer transcoder"; "" unknown

    def kind_of(self, node: GraphNode) -> str:
        """What the node is, in words (not circuit-tracer's `feature_type` for every feature)."""
        if node.kind == "logit":
            return "logit"
        if node.kind == "embedding":
            return "token embedding"
        if "error" in node.kind:
            return "MLP reconstruction error"
        if self.transcoder_kind:
            return f"{self.transcoder_kind} feature"
        return f"transcoder feature (the JSON says {node.kind!r}; the set's kind is not recorded)"

    def where(self, node: GraphNode) -> str:
        """Its place: logits after the last layer (the JSON's layer is n_layers + 1)."""
        if node.kind == "logit" and node.layer.isdigit():
            last = int(node.layer) - 2
            return f"Logits, after the last layer ({last}; the JSON's layer {node.layer})"
        if node.layer == "E":
            return "Token embeddings"
        return f"Layer {node.layer}"


def _num(value: Any, where: str, *, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise GraphError(f"{where} must be a finite number, got {value!r:.40}")
    return float(value)


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise GraphError(f"{where} must be a string, got {type(value).__name__}")
    return value


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise GraphError(f"{where} must be an integer, got {value!r:.40}")
    return value


def check_graph(data: Any) -> GraphDoc:
    """The graph in `data`, or GraphError naming the first field that is wrong."""
    if not isinstance(data, dict):
        raise GraphError("a graph is a JSON object with metadata, nodes and links")
    for key in ("metadata", "nodes", "links"):
        if key not in data:
            raise GraphError(f"the graph has no '{key}'")
    meta, raw_nodes, raw_links = data["metadata"], data["nodes"], data["links"]
    if not isinstance(meta, dict):
        raise GraphError("metadata must be an object")
    if not isinstance(raw_nodes, list) or not isinstance(raw_links, list):
        raise GraphError("nodes and links must be arrays")
    if len(raw_nodes) > MAX_NODES:
        raise GraphError(
            f"{len(raw_nodes):,} nodes; at most {MAX_NODES:,} are accepted: {SMALLER}", 413
        )
    if len(raw_links) > MAX_LINKS:
        raise GraphError(
            f"{len(raw_links):,} links; at most {MAX_LINKS:,} are accepted: {SMALLER}", 413
        )
    tokens = meta.get("prompt_tokens", [])
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise GraphError("metadata.prompt_tokens must be an array of strings")
    nodes: list[GraphNode] = []
    seen: set[str] = set()
    for i, n in enumerate(raw_nodes):
        where = f"nodes[{i}]"
        if not isinstance(n, dict):
            raise GraphError(f"{where} must be an object")
        # Ids may repeat: circuit-tracer names the layer-L error at position p `0_L_p`, which is
        # also layer 0's feature L at p (same row and column), and links cannot tell them apart.
        node_id = _str(n.get("node_id"), f"{where}.node_id")
        seen.add(node_id)
        pos = _int(n.get("ctx_idx"), f"{where}.ctx_idx")
        if pos < 0:
            raise GraphError(f"{where}.ctx_idx must be 0 or more, got {pos}")
        layer = _str(n.get("layer"), f"{where}.layer")
        if layer != "E" and not (layer.isascii() and layer.isdigit() and len(layer) < 6):
            raise GraphError(f"{where}.layer must be 'E' or a layer number, got {layer!r:.40}")
        feature = n.get("feature")
        nodes.append(
            GraphNode(
                node_id=node_id,
                layer=layer,
                pos=pos,
                kind=_str(n.get("feature_type"), f"{where}.feature_type"),
                feature=None if feature is None else _int(feature, f"{where}.feature"),
                influence=_num(n.get("influence"), f"{where}.influence", optional=True),
                activation=_num(n.get("activation"), f"{where}.activation", optional=True),
                clerp=_str(n.get("clerp", ""), f"{where}.clerp"),
                token_prob=_num(n.get("token_prob", 0.0), f"{where}.token_prob") or 0.0,
            )
        )
    links: list[GraphLink] = []
    for i, link in enumerate(raw_links):
        where = f"links[{i}]"
        if not isinstance(link, dict):
            raise GraphError(f"{where} must be an object")
        ends = [_str(link.get(k), f"{where}.{k}") for k in ("source", "target")]
        for k, end in zip(("source", "target"), ends, strict=True):
            if end not in seen:
                raise GraphError(f"{where}.{k} {end!r:.60} is not a node of the graph")
        weight = _num(link.get("weight"), f"{where}.weight")
        assert weight is not None
        links.append(GraphLink(ends[0], ends[1], weight))
    threshold = _num(meta.get("node_threshold"), "metadata.node_threshold", optional=True)
    scan, kind = meta.get("scan"), meta.get("transcoder_kind")
    return GraphDoc(
        slug=_str(meta.get("slug", "graph"), "metadata.slug") or "graph",
        scan=scan if isinstance(scan, str) else "",
        prompt=_str(meta.get("prompt", ""), "metadata.prompt"),
        prompt_tokens=tuple(tokens),
        node_threshold=threshold,
        nodes=tuple(nodes),
        links=tuple(links),
        transcoder_kind=kind if kind in TRANSCODER_KINDS else "",
    )


# ---------------------------------------------------------------- drawing

# The drawing fills the page's main column at a laptop's 1280 px (1232 px less a scrollbar)
# and scrolls sideways inside its frame on narrower windows. Nodes sharing a layer and position
# are laid out in lines PITCH apart (more than a node's diameter), so none hides another.
WIDTH = 1180
MIN_COL_W = 90
ROW_H = 56
LEFT = 60
RIGHT = 20
TOP = 20
RADIUS = 5
PITCH = 14


@dataclass(frozen=True)
class Placed:
    node: GraphNode
    x: float
    y: float
    css: str  # feature | error | token | logit


@dataclass(frozen=True)
class Edge:
    x1: float
    y1: float
    x2: float
    y2: float
    width: float
    sign: str  # pos | neg
    link: GraphLink


@dataclass(frozen=True)
class Drawing:
    width: int
    height: int
    nodes: tuple[Placed, ...]
    edges: tuple[Edge, ...]
    rows: tuple[tuple[float, str], ...]  # (y, label) per layer row
    columns: tuple[tuple[float, str], ...]  # (x, token) per prompt position
    dropped: int  # edges not drawn (over MAX_DRAWN_LINKS)


def _css(kind: str) -> str:
    if kind == "embedding":
        return "token"
    if kind == "logit":
        return "logit"
    return "error" if "error" in kind else "feature"


def _row_order(layer: str) -> int:
    return -1 if layer == "E" else int(layer)


def layout(doc: GraphDoc) -> Drawing:
    """Columns are prompt positions, rows layers (tokens at the bottom, logits on top); nodes
    sharing a cell are laid out in lines of up to `per_line`, most influential first, so each
    stays visible and clickable."""
    layers = sorted({n.layer for n in doc.nodes}, key=_row_order)
    n_pos = max([n.pos for n in doc.nodes] + [len(doc.prompt_tokens) - 1, 0]) + 1
    col_w = max(MIN_COL_W, (WIDTH - LEFT - RIGHT) / n_pos)
    per_line = max(1, int(col_w * 0.8 // PITCH))
    cells: dict[tuple[str, int], list[GraphNode]] = {}
    for n in doc.nodes:
        cells.setdefault((n.layer, n.pos), []).append(n)
    lines = {layer: 1 for layer in layers}
    for (layer, _), members in cells.items():
        lines[layer] = max(lines[layer], math.ceil(len(members) / per_line))
    heights = {layer: max(ROW_H, lines[layer] * PITCH + 28) for layer in layers}
    height = TOP * 2 + sum(heights.values())
    row_y, bottom = {}, height - TOP
    for layer in layers:
        row_y[layer] = bottom - heights[layer] / 2
        bottom -= heights[layer]
    placed: list[Placed] = []
    for (layer, pos), members in cells.items():
        members.sort(key=lambda n: (n.influence is None, n.influence or 0.0, n.node_id))
        n_lines = math.ceil(len(members) / per_line)
        for k, n in enumerate(members):
            line, slot = divmod(k, per_line)
            in_line = min(per_line, len(members) - line * per_line)
            x = LEFT + col_w * (pos + 0.5) + (slot - (in_line - 1) / 2) * PITCH
            y = row_y[layer] + (line - (n_lines - 1) / 2) * PITCH
            placed.append(Placed(n, round(x, 1), round(y, 1), _css(n.kind)))
    # A repeated id's links attach to the node listed first (see check_graph).
    at: dict[str, Placed] = {}
    for p in placed:
        at.setdefault(p.node.node_id, p)
    strongest = sorted(doc.links, key=lambda link: -abs(link.weight))
    drawn = strongest[:MAX_DRAWN_LINKS]
    top = max((abs(link.weight) for link in drawn), default=1.0) or 1.0
    edges = tuple(
        Edge(
            at[link.source].x,
            at[link.source].y,
            at[link.target].x,
            at[link.target].y,
            round(0.4 + 3.6 * abs(link.weight) / top, 2),
            "pos" if link.weight >= 0 else "neg",
            link,
        )
        for link in reversed(drawn)  # the strongest last, so it is drawn on top
    )
    logit_layers = {n.layer for n in doc.nodes if n.kind == "logit"}
    rows = tuple((row_y[layer], _row_label(layer, logit_layers)) for layer in layers)
    columns = tuple(
        (LEFT + col_w * (p + 0.5), doc.prompt_tokens[p] if p < len(doc.prompt_tokens) else "")
        for p in range(n_pos)
    )
    return Drawing(
        width=round(LEFT + col_w * n_pos + RIGHT),
        height=height + 24,
        nodes=tuple(placed),
        edges=edges,
        rows=rows,
        columns=columns,
        dropped=len(doc.links) - len(drawn),
    )


def _row_label(layer: str, logit_layers: set[str]) -> str:
    # Logits sit on their own row, numbered n_layers + 1 in the viewer's format.
    if layer == "E":
        return "tokens"
    return "logits" if layer in logit_layers else f"L{layer}"


def logit_rows(doc: GraphDoc) -> list[GraphNode]:
    """The target logits, most probable first."""
    return sorted((n for n in doc.nodes if n.kind == "logit"), key=lambda n: -n.token_prob)


def top_features(doc: GraphDoc, k: int = 20) -> list[GraphNode]:
    """Feature nodes by influence: the value is the cumulative influence share at which pruning
    keeps the node, so the smallest is the most influential."""
    feats = [n for n in doc.nodes if n.kind not in ("embedding", "logit") and "error" not in n.kind]
    return sorted(feats, key=lambda n: (n.influence is None, n.influence or 0.0, n.node_id))[:k]


@dataclass(frozen=True)
class NodeDetail:
    nodes: tuple[GraphNode, ...]  # more than one where the id repeats (see check_graph)
    incoming: tuple[GraphLink, ...]
    outgoing: tuple[GraphLink, ...]


def node_detail(doc: GraphDoc, node_id: str, k: int = 10) -> NodeDetail | None:
    """A node's own numbers and its strongest `k` incoming and outgoing edges; None if absent."""
    nodes = tuple(n for n in doc.nodes if n.node_id == node_id)
    if not nodes:
        return None
    strongest = sorted(doc.links, key=lambda link: -abs(link.weight))
    return NodeDetail(
        nodes,
        tuple(link for link in strongest if link.target == node_id)[:k],
        tuple(link for link in strongest if link.source == node_id)[:k],
    )
