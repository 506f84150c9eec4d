"""Layout of the block diagram: a residual spine, attention drawn above it, the MLP below.

Pure geometry in pixels; the template draws the lines as SVG and each point as an HTML link
(so htmx and plain navigation both work on it). Parallel-block families branch the MLP off
`resid_pre`; their `resid_mid` stays on the spine, drawn absent.
"""

from __future__ import annotations

from dataclasses import dataclass

WIDTH = 1470
HEIGHT = 560
SPINE_Y = 290
ROW_GAP = 46

# Lanes: x range, then rows listed from the spine outwards.
ATTN_X = (240, 650)
MLP_X = (810, 1220)
ATTN_ROWS = (
    ("attn_out", "attn_out_post"),
    ("attn_in", "value", "attn_gate", "z"),
    ("k", "k_norm_in", "k_norm_out", "k_rot", "attn_probs"),
    ("q", "q_norm_in", "q_norm_out", "q_rot", "attn_scores"),
    ("attn_stream_collapse", "attn_stream_write", "attn_stream_mix"),
)
MLP_ROWS = (
    ("mlp_in", "mlp_pre", "mlp_pre_linear"),
    ("router_logits", "expert_weights", "expert_indices"),
    ("mlp_act", "mlp_out", "mlp_out_post"),
    ("mlp_stream_collapse", "mlp_stream_write", "mlp_stream_mix"),
)
SPINE = {
    "embeddings": 70,
    "resid_pre": 180,
    "resid_mid": 732,
    "resid_post": 1306,
    "final_norm": 1412,
}
BELOW_SPINE = {"resid_streams": (450, SPINE_Y + 44), "lm_head": (1412, SPINE_Y + 60)}
ATTN_JOIN_X = 680
MLP_JOIN_X = 1250


@dataclass(frozen=True)
class Node:
    point: str
    x: int
    y: int
    lane: str  # spine | attention | mlp | trunk


@dataclass(frozen=True)
class Segment:
    x1: int
    y1: int
    x2: int
    y2: int


@dataclass(frozen=True)
class Box:
    label: str
    x: int
    y: int
    w: int
    h: int


@dataclass(frozen=True)
class Layout:
    width: int
    height: int
    nodes: tuple[Node, ...]
    segments: tuple[Segment, ...]
    boxes: tuple[Box, ...]
    joins: tuple[tuple[int, int], ...]  # the + where a branch is added back to the residual
    parallel: bool


def _row_nodes(names: tuple[str, ...], x_range: tuple[int, int], y: int, lane: str) -> list[Node]:
    """Spread a row across the lane, each label getting room in proportion to its length."""
    lo, hi = x_range
    weights = [len(n) + 6 for n in names]
    unit = (hi - lo) / sum(weights)
    nodes, left = [], float(lo)
    for name, w in zip(names, weights, strict=True):
        nodes.append(Node(name, round(left + unit * w / 2), y, lane))
        left += unit * w
    return nodes


def layout(parallel: bool = False) -> Layout:
    nodes: list[Node] = []
    for i, row in enumerate(ATTN_ROWS):
        nodes += _row_nodes(row, ATTN_X, SPINE_Y - 50 - i * ROW_GAP, "attention")
    for i, row in enumerate(MLP_ROWS):
        nodes += _row_nodes(row, MLP_X, SPINE_Y + 50 + i * ROW_GAP, "mlp")
    for name, x in SPINE.items():
        nodes.append(
            Node(name, x, SPINE_Y, "trunk" if name in {"embeddings", "final_norm"} else "spine")
        )
    for name, (x, y) in BELOW_SPINE.items():
        nodes.append(Node(name, x, y, "trunk" if name != "resid_streams" else "spine"))
    attn_top = SPINE_Y - 50 - (len(ATTN_ROWS) - 1) * ROW_GAP - 40
    mlp_bottom = SPINE_Y + 50 + (len(MLP_ROWS) - 1) * ROW_GAP + 24
    attn_box = Box(
        "attention", ATTN_X[0] - 14, attn_top, ATTN_X[1] - ATTN_X[0] + 28, SPINE_Y - 24 - attn_top
    )
    mlp_box = Box(
        "MLP", MLP_X[0] - 14, SPINE_Y + 24, MLP_X[1] - MLP_X[0] + 28, mlp_bottom - SPINE_Y - 24
    )
    block = Box("decoder block L (repeated n_layers times)", 120, 14, 1362 - 120, HEIGHT - 28)
    attn_mid_y = SPINE_Y - 50 - ROW_GAP
    mlp_mid_y = SPINE_Y + 50 + ROW_GAP
    branch_x = SPINE["resid_pre"] + 30
    segments = [
        Segment(20, SPINE_Y, SPINE["final_norm"], SPINE_Y),  # the residual stream
        Segment(SPINE["final_norm"], SPINE_Y, SPINE["final_norm"], SPINE_Y + 60),
        Segment(branch_x, SPINE_Y, branch_x, attn_mid_y),
        Segment(branch_x, attn_mid_y, attn_box.x, attn_mid_y),
    ]
    if parallel:
        # Attention and MLP both read the block input and are added back together.
        segments += [
            Segment(attn_box.x + attn_box.w, SPINE_Y - 50, MLP_JOIN_X, SPINE_Y - 50),
            Segment(MLP_JOIN_X, SPINE_Y - 50, MLP_JOIN_X, SPINE_Y),
            Segment(branch_x, SPINE_Y, branch_x, HEIGHT - 40),
            Segment(branch_x, HEIGHT - 40, mlp_box.x - 20, HEIGHT - 40),
            Segment(mlp_box.x - 20, HEIGHT - 40, mlp_box.x - 20, mlp_mid_y),
            Segment(mlp_box.x - 20, mlp_mid_y, mlp_box.x, mlp_mid_y),
        ]
        joins: tuple[tuple[int, int], ...] = ((MLP_JOIN_X, SPINE_Y),)
    else:
        segments += [
            Segment(attn_box.x + attn_box.w, SPINE_Y - 50, ATTN_JOIN_X, SPINE_Y - 50),
            Segment(ATTN_JOIN_X, SPINE_Y - 50, ATTN_JOIN_X, SPINE_Y),
            Segment(SPINE["resid_mid"] + 48, SPINE_Y, SPINE["resid_mid"] + 48, mlp_mid_y),
            Segment(SPINE["resid_mid"] + 48, mlp_mid_y, mlp_box.x, mlp_mid_y),
        ]
        joins = ((ATTN_JOIN_X, SPINE_Y), (MLP_JOIN_X, SPINE_Y))
    segments += [
        Segment(mlp_box.x + mlp_box.w, mlp_mid_y, MLP_JOIN_X, mlp_mid_y),
        Segment(MLP_JOIN_X, mlp_mid_y, MLP_JOIN_X, SPINE_Y),
    ]
    return Layout(
        WIDTH, HEIGHT, tuple(nodes), tuple(segments), (block, attn_box, mlp_box), joins, parallel
    )
