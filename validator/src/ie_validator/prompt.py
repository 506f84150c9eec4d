"""The fixed input of every comparison, and which layers are compared."""

from __future__ import annotations

PROMPT = "The capital of France is Paris, and the capital of Japan is"


def compared_layers(n_layers: int) -> list[int]:
    """First, middle and last; plus 3/4 depth on trunks of 16 layers or more."""
    layers = {0, n_layers // 2, n_layers - 1}
    if n_layers >= 16:
        layers.add((3 * n_layers) // 4)
    return sorted(x for x in layers if 0 <= x < n_layers)
