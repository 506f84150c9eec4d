"""Names to points and addresses: our grammar or a TransformerLens / nnterp spelling, checked
against the registry, with the nearest name suggested on a miss. The one place above the address
grammar, the points table and the peer spellings, so none of them imports another back."""

from __future__ import annotations

from ie_core.errors import (
    AddressError,
    LayerOnTrunkPointError,
    MissingLayerError,
    UnknownPointError,
)
from ie_core.grammar.address import Address, AddressLike, parse_address
from ie_core.grammar.peer_names import from_peer_name, looks_foreign, nearest, spelled_point
from ie_core.grammar.points import POINTS_BY_NAME, Point


def get_point(name: str) -> Point:
    try:
        return POINTS_BY_NAME[name]
    except KeyError:
        raise UnknownPointError(
            f"unknown point {name!r}; {nearest(name)} Known points: {', '.join(POINTS_BY_NAME)}",
            name,
        ) from None


def check_address(address: Address) -> Point | None:
    """Check the address against its point's scope; returns the point (None for `path.`)."""
    if address.is_path:
        return None
    point = get_point(address.name)
    if point.per_layer and address.layer is None:
        raise MissingLayerError(
            f"{address.name!r} is a per-layer point; write e.g. '{address.name}.0'", str(address)
        )
    if not point.per_layer and address.layer is not None:
        raise LayerOnTrunkPointError(
            f"{address.name!r} is a trunk point and takes no layer; write '{address.name}'",
            str(address),
        )
    return point


def to_address(value: AddressLike, *, check: bool = False) -> Address:
    """Accept an Address, a string, or a `(name, layer[, stream])` tuple.

    A string may also be a TransformerLens or nnterp hook name (`blocks.3.hook_resid_post`,
    `layers_output[3]`): it becomes our address (`resid_post.3`), see `ie_core.peer_names`.
    With `check=True` the name must be a registered point and its layer coordinate must match
    the point's scope (no layer on a trunk point, a layer on a per-layer point).
    """
    if isinstance(value, Address):
        address = value
    elif isinstance(value, str):
        address = _parse_any(value)
    elif isinstance(value, tuple) and 1 <= len(value) <= 3 and isinstance(value[0], str):
        address = Address(*value)  # type: ignore[arg-type]
    else:
        raise AddressError(f"cannot make an address from {value!r}", value)
    if check:
        check_address(address)
    return address


def _parse_any(text: str) -> Address:
    """Our grammar, or a TransformerLens / nnterp hook name mapped to our point (`peer_names`)."""
    if (peer := from_peer_name(text)) is not None:
        return peer
    try:
        return parse_address(text)
    except AddressError as error:
        if not looks_foreign(text):
            raise
        raise type(error)(f"{error.args[0]}; {nearest(text)}", text) from None


def point_name(text: str) -> str:
    """The point a `point=` argument names: ours (`resid_pre`) or a TransformerLens / nnterp
    spelling without a layer (`hook_resid_pre`, `blocks.{L}.attn.hook_z`, `attn.hook_z`,
    `layers_output`); anything else is an `UnknownPointError` naming the nearest point."""
    if (name := spelled_point(text)) is not None:
        return name
    if not isinstance(text, str):
        raise UnknownPointError(f"a point is named by a string, got {text!r}", text)
    return get_point(text).name  # raises, naming the nearest point


# Per-layer points in the table's order are the block's forward order up to resid_post; the
# multi-stream points listed after it are computed at several places in the block, so no one
# rank holds for them (resid_streams is resid_post's stack).
_LAYER_ORDER = {name: i for i, name in enumerate(POINTS_BY_NAME)}
_RANKED_UNTIL = _LAYER_ORDER["resid_post"]


def forward_rank(address: Address) -> tuple[int, int] | None:
    """Where `address` is computed in one forward, as a sortable key (embeddings first, then each
    layer's points in forward order, then the final norm and the unembed); None where no one
    place holds (path addresses, the multi-stream mixing points)."""
    if address.is_path:
        return None
    point = get_point(address.name)
    index = _LAYER_ORDER[point.name]
    if point.name == "resid_streams":
        index = _RANKED_UNTIL
    elif point.per_layer and index > _RANKED_UNTIL:
        return None
    if not point.per_layer:
        return (-1 if point.name == "embeddings" else 1 << 30, index)
    return (address.layer if address.layer is not None else 0, index)


def runs_before(earlier: Address, later: Address) -> bool:
    """True where `earlier` is computed before `later` in every forward of every family."""
    a, b = forward_rank(earlier), forward_rank(later)
    return a is not None and b is not None and a < b


__all__ = ["check_address", "forward_rank", "get_point", "point_name", "runs_before", "to_address"]
