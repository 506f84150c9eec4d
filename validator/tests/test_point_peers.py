"""The peer names the cheat sheet shows (`ie_core.grammar.points.Point.peers`) are the validated ones.

`Point.peers` is what docs/SUPPORTED_POINTS.md and the dashboard print for "the same tensor in
TransformerLens / nnsight / nnterp"; the validator's tables (`ie_validator.mappings`) are what
the validation matrix proves equal. Each point is compared on one reference family where it is
native (the first of PREFERRED that has it; sandwich norms for the *_post points), so a name
fixed in one place and not the other fails here.
"""

from __future__ import annotations

import dataclasses

import pytest
from ie_core.grammar import FAMILIES, POINTS, PeerNames, Point
from ie_validator.mappings import Hook, lookup

ENGINES = (("transformer-lens", "transformer_lens"), ("nnsight", "nnsight"), ("nnterp", "nnterp"))
PREFERRED = ("llama", "qwen3", "gemma2", "qwen3-moe", "qwen3-next", "deepseek-v4")
# Points every family has, but whose name is only distinct from another point's on sandwich norms.
NATIVE_ON = {"attn_out_post": "gemma2", "mlp_out_post": "gemma2"}


def reference_family(point: Point) -> str:
    if point.name in NATIVE_ON:
        return NATIVE_ON[point.name]
    by_slug = {f.slug: f for f in FAMILIES}
    having = [s for s in PREFERRED if s in by_slug and by_slug[s].has_point(point)]
    return having[0] if having else "llama"


def mismatches(point: Point) -> list[str]:
    family = reference_family(point)
    out = []
    for engine, attr in ENGINES:
        entry = lookup(engine, family, point.name)
        validated = entry.name if isinstance(entry, Hook) else None
        shown = getattr(point.peers, attr)
        if shown != validated:
            out.append(
                f"{point.name} / {engine} on {family}: shown {shown!r}, validated {validated!r}"
            )
    return out


@pytest.mark.parametrize("point", POINTS, ids=lambda p: p.name)
def test_shown_peer_names_are_the_validated_ones(point: Point) -> None:
    assert mismatches(point) == []


def test_negative_control_a_wrong_name_is_caught() -> None:
    point = next(p for p in POINTS if p.name == "resid_post")
    wrong = dataclasses.replace(point, peers=PeerNames("blocks.{L}.hook_resid_pre", None, None))
    found = mismatches(wrong)
    assert len(found) == 3 and "hook_resid_pre" in found[0]
