"""Eager has one resolver per registry point: a new point without one fails here, by name."""

from __future__ import annotations

from ie_core.grammar import POINTS
from ie_eager.resolve import LAYER_RESOLVERS, TRUNK_RESOLVERS


def test_every_registry_point_has_exactly_one_eager_resolver() -> None:
    per_layer = {p.name for p in POINTS if p.per_layer}
    trunk = {p.name for p in POINTS if not p.per_layer}
    assert set(LAYER_RESOLVERS) == per_layer, (
        "eager: per-layer points without a resolver in ie_eager/resolve.py LAYER_RESOLVERS: "
        f"{sorted(per_layer - set(LAYER_RESOLVERS))}; resolvers for no point: "
        f"{sorted(set(LAYER_RESOLVERS) - per_layer)}"
    )
    assert set(TRUNK_RESOLVERS) == trunk, (
        f"eager: trunk points without a resolver: {sorted(trunk - set(TRUNK_RESOLVERS))}"
    )
