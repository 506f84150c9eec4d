"""Other engines' hook names as addresses: `blocks.3.hook_resid_post` is `resid_post.3`.

The names come from the one mapping table, each point's `PeerNames` in `ie_core.points`
(TransformerLens and nnterp; nnsight's are Llama module paths, so they are not accepted here).
A name two points share in TransformerLens (`hook_attn_out`, `hook_mlp_out`) is the tensor TL adds
to the residual, so it maps to the `_post` point. Classic HookedTransformer spells the norm outputs
`hook_normalized` where the table (TransformerBridge) says `hook_out`; both are accepted.
"""

from __future__ import annotations

import difflib
import functools
import re
from dataclasses import dataclass

from ie_core.address import Address

_LAYER = "{L}"
_NORM_OUT = re.compile(r"^(blocks\.\{L\}\.ln[12]|ln_final)\.hook_out$")


@dataclass(frozen=True)
class PeerName:
    """One accepted foreign spelling: its pattern (`{L}` for the layer) and our point."""

    engine: str
    pattern: str
    point: str
    per_layer: bool


def _spellings(engine: str, pattern: str) -> tuple[str, ...]:
    if engine == "transformer_lens" and _NORM_OUT.match(pattern):
        return (pattern, pattern.removesuffix("hook_out") + "hook_normalized")
    return (pattern,)


@functools.cache
def peer_names() -> tuple[PeerName, ...]:
    """Every accepted spelling; later points win a shared name (the `_post` ones, see above)."""
    from ie_core.points import POINTS  # points builds on the address module, as this does

    by_pattern: dict[str, PeerName] = {}
    for point in POINTS:
        for engine in ("transformer_lens", "nnterp"):
            pattern = getattr(point.peers, engine)
            if pattern is None:
                continue
            for spelling in _spellings(engine, pattern):
                by_pattern[spelling] = PeerName(engine, spelling, point.name, point.per_layer)
    return tuple(by_pattern.values())


@functools.cache
def _matchers() -> tuple[tuple[re.Pattern[str], PeerName], ...]:
    out = []
    for peer in peer_names():
        head, _, tail = peer.pattern.partition(_LAYER)
        body = re.escape(head) + (
            r"(0|[1-9][0-9]*)" + re.escape(tail) if _LAYER in peer.pattern else ""
        )
        out.append((re.compile(body), peer))
    return tuple(out)


def from_peer_name(text: str) -> Address | None:
    """Our address for a TransformerLens / nnterp name, or None when `text` is not one."""
    for regex, peer in _matchers():
        if m := regex.fullmatch(text):
            return Address(peer.point, int(m.group(1)) if peer.per_layer else None)
    return None


def looks_foreign(text: str) -> bool:
    """True for text shaped like a peer engine's name (so a miss deserves a suggestion)."""
    return "hook_" in text or text.startswith(("blocks.", "ln_final")) or "[" in text


def nearest(text: str) -> str:
    """A sentence naming the point (or peer name and its point) closest to `text`."""
    from ie_core.points import POINTS

    generic = re.sub(r"(?<=[.\[])[0-9]+(?=[.\]]|$)", _LAYER, text)
    layer = re.search(r"(?<=[.\[])([0-9]+)(?=[.\]]|$)", text)
    candidates = {p.name: p.name for p in POINTS}
    candidates.update({peer.pattern: peer.point for peer in peer_names()})
    close = difflib.get_close_matches(generic, list(candidates), n=1, cutoff=0.5)
    if not close:
        return "see `ie points` or docs/SUPPORTED_POINTS.md for the 34 points."
    point = candidates[close[0]]
    ours = f"{point}.{layer.group(1)}" if layer and _is_layer(point) else point
    if close[0] == point:
        return f"did you mean {ours!r}?"
    return f"the nearest name is {close[0]!r}, which is our {ours!r}."


def _is_layer(name: str) -> bool:
    from ie_core.points import POINTS_BY_NAME

    return POINTS_BY_NAME[name].per_layer
