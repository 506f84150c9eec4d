"""Other engines' hook names as addresses: `blocks.3.hook_resid_post` is `resid_post.3`.

The names come from the one mapping table, each point's `PeerNames` in `ie_core.points`
(TransformerLens and nnterp; nnsight's are Llama module paths, so they are not accepted here).
A name two points share in TransformerLens (`hook_attn_out`, `hook_mlp_out`) is the tensor TL adds
to the residual, so it maps to the `_post` point. Classic HookedTransformer spells the norm outputs
`hook_normalized` where the table (TransformerBridge) says `hook_out`; both are accepted.
TL's `hook_q` / `hook_k` (the projections' outputs) are also `q_norm_in` / `k_norm_in` on QK-norm
families, but every family has `q` / `k`, so the names map there.
"""

from __future__ import annotations

import difflib
import functools
import re
from dataclasses import dataclass

from ie_core.grammar.address import Address
from ie_core.grammar.points import POINTS, POINTS_BY_NAME

_LAYER = "{L}"
# Points that share a TL name with a point every family has, and so never take it as input.
_NEVER_TAKE = frozenset({"q_norm_in", "k_norm_in"})
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
    by_pattern: dict[str, PeerName] = {}
    for point in POINTS:
        for engine in ("transformer_lens", "nnterp"):
            pattern = getattr(point.peers, engine)
            if pattern is None:
                continue
            for spelling in _spellings(engine, pattern):
                if point.name in _NEVER_TAKE and spelling in by_pattern:
                    continue
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


@functools.cache
def _point_spellings() -> dict[str, str]:
    """Layer-free spellings of each point, from the same table: a TL pattern with its `{L}`
    (`blocks.{L}.hook_resid_pre`), its part after `blocks.{L}.` (`hook_resid_pre`, `attn.hook_z`),
    its last part where only one point ends so (`hook_z`; not `hook_out`), and an nnterp name
    without its `[{L}]` (`layers_output`)."""
    out: dict[str, str] = {}
    last: dict[str, set[str]] = {}
    for peer in peer_names():
        out[peer.pattern] = peer.point
        if peer.engine == "nnterp":
            out[peer.pattern.removesuffix("[" + _LAYER + "]")] = peer.point
            continue
        tail = peer.pattern.removeprefix("blocks." + _LAYER + ".")
        out[tail] = peer.point
        last.setdefault(tail.rpartition(".")[2], set()).add(peer.point)
    for name, points in last.items():
        if len(points) == 1:
            out.setdefault(name, next(iter(points)))
    return out


def spelled_point(text: str) -> str | None:
    """Our point name for `text` when it is one (ours or a layer-free peer spelling), else None."""
    if not isinstance(text, str):
        return None
    if text in POINTS_BY_NAME:
        return text
    return _point_spellings().get(text)


@functools.cache
def _tl_patterns() -> dict[str, str]:
    """Our point -> its TransformerLens pattern, where TL names it (a shared name goes to the point
    it maps back to, as in `peer_names`)."""
    out: dict[str, str] = {}
    for peer in peer_names():
        if peer.engine == "transformer_lens":
            out.setdefault(peer.point, peer.pattern)
    return out


def tl_name(address: Address) -> str | None:
    """The TransformerLens hook name of one of our addresses (`resid_post.3` ->
    `blocks.3.hook_resid_post`), or None where TL has no name for it."""
    pattern = _tl_patterns().get(address.name)
    if pattern is None or address.stream is not None:
        return None
    return pattern.replace(_LAYER, str(address.layer)) if address.layer is not None else pattern


def looks_foreign(text: str) -> bool:
    """True for text shaped like a peer engine's name (so a miss deserves a suggestion)."""
    return "hook_" in text or text.startswith(("blocks.", "ln_final")) or "[" in text


def nearest(text: str) -> str:
    """A sentence naming the point (or peer name and its point) closest to `text`."""
    generic = re.sub(r"(?<=[.\[])[0-9]+(?=[.\]]|$)", _LAYER, text)
    layer = re.search(r"(?<=[.\[])([0-9]+)(?=[.\]]|$)", text)
    candidates = {p.name: p.name for p in POINTS}
    candidates.update({peer.pattern: peer.point for peer in peer_names()})
    close = difflib.get_close_matches(generic, list(candidates), n=1, cutoff=0.5)
    if not close:
        return "see `ie points` or docs/SUPPORTED_POINTS.md for the 38 points."
    point = candidates[close[0]]
    ours = f"{point}.{layer.group(1)}" if layer and _is_layer(point) else point
    if close[0] == point:
        return f"did you mean {ours!r}?"
    return f"the nearest name is {close[0]!r}, which is our {ours!r}."


def _is_layer(name: str) -> bool:
    return POINTS_BY_NAME[name].per_layer
