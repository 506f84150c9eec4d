"""What the dashboard's graph page accepts of an attribution graph JSON (`ie trace`'s output).

The dashboard refuses a graph over these (they keep one page's SVG drawable and a POST under its
body limit); `ie trace` reads them to say, when it writes a graph over them, which thresholds
bring it under. Torch-free: the dashboard imports it without ie-core's circuits package.
"""

from __future__ import annotations

__all__ = [
    "MAX_GRAPH_BYTES",
    "MAX_GRAPH_LINKS",
    "MAX_GRAPH_NODES",
    "THRESHOLD_FLAGS",
    "over_limits",
]

MAX_GRAPH_NODES = 5_000
MAX_GRAPH_LINKS = 50_000
MAX_GRAPH_BYTES = 20 * 2**20  # the dashboard's request body limit
THRESHOLD_FLAGS = "`ie trace`'s --node-threshold / --edge-threshold"


def over_limits(nodes: int, links: int, size: int) -> list[str]:
    """What of (nodes, links, file bytes) is over the page's limits, as phrases; [] if none."""
    over = []
    if nodes > MAX_GRAPH_NODES:
        over.append(f"{nodes:,} nodes (at most {MAX_GRAPH_NODES:,})")
    if links > MAX_GRAPH_LINKS:
        over.append(f"{links:,} edges (at most {MAX_GRAPH_LINKS:,})")
    if size > MAX_GRAPH_BYTES:
        over.append(f"{size:,} bytes (at most {MAX_GRAPH_BYTES:,})")
    return over
