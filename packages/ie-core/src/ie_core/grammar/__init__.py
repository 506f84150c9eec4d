"""The grammar: addresses (`resid_post.10`), the 38 points, the families, and the peer engines'
spellings of them. Layered bottom-up: `address`, `points`, `peer_names`, `naming`; `families` reads
the points. Torch-free."""

from ie_core.grammar.address import (
    Address,
    AddressLike,
    check_layer,
    format_address,
    parse_address,
)
from ie_core.grammar.families import (
    FAMILIES,
    FAMILIES_BY_SLUG,
    TRAIT_NOTES,
    Family,
    Trait,
    family_for_architecture,
    get_family,
)
from ie_core.grammar.naming import (
    check_address,
    forward_rank,
    get_point,
    point_name,
    runs_before,
    to_address,
)
from ie_core.grammar.peer_names import (
    from_peer_name,
    looks_foreign,
    nearest,
    peer_names,
    spelled_point,
    tl_name,
)
from ie_core.grammar.points import (
    POINTS,
    POINTS_BY_NAME,
    PeerNames,
    Point,
    Scope,
    Service,
    Serving,
    Width,
)

__all__ = [
    "FAMILIES",
    "FAMILIES_BY_SLUG",
    "POINTS",
    "POINTS_BY_NAME",
    "TRAIT_NOTES",
    "Address",
    "AddressLike",
    "Family",
    "PeerNames",
    "Point",
    "Scope",
    "Service",
    "Serving",
    "Trait",
    "Width",
    "check_address",
    "check_layer",
    "family_for_architecture",
    "format_address",
    "forward_rank",
    "from_peer_name",
    "get_family",
    "get_point",
    "looks_foreign",
    "nearest",
    "parse_address",
    "peer_names",
    "point_name",
    "runs_before",
    "spelled_point",
    "tl_name",
    "to_address",
]
