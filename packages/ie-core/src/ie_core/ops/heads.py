"""Per-head targets of `Patch` and `Scale`: the columns `[h * head_dim, (h + 1) * head_dim)` of each
listed head of a per-head point (`z`, `value`, ...)."""

from __future__ import annotations

from typing import Any

from ie_core.errors import SteeringSpecError
from ie_core.ops.values import integer


def parse_heads(heads: Any, head_dim: Any) -> tuple[tuple[int, ...], int | None]:
    """(sorted heads, head_dim) from what a user passes; head_dim is None when no heads are."""
    if heads is None:
        heads = ()
    if isinstance(heads, int):
        heads = (heads,)
    picked = tuple(integer(h, "head") for h in heads)
    if len(set(picked)) != len(picked):
        raise SteeringSpecError(f"heads {list(picked)} list a head more than once")
    if not picked:
        if head_dim is not None:
            raise SteeringSpecError("head_dim is given but no heads: pass heads=(...) too")
        return (), None
    if head_dim is None:
        raise SteeringSpecError(
            "heads need head_dim (the width of one head on this point: point width / heads)"
        )
    dim = integer(head_dim, "head_dim")
    if dim == 0:
        raise SteeringSpecError("head_dim must be >= 1")
    return tuple(sorted(picked)), dim


def check_heads(heads: tuple[int, ...], head_dim: int | None, width: int, what: str) -> None:
    """Refuse heads that do not split a `width`-wide point (checked where the width is known)."""
    if not heads or head_dim is None:
        return
    if width % head_dim:
        raise SteeringSpecError(
            f"{what}: head_dim {head_dim} does not divide the point's width {width}; per-head "
            "ops target points whose width is heads * head_dim (z, value)"
        )
    n = width // head_dim
    past = [h for h in heads if h >= n]
    if past:
        raise SteeringSpecError(f"{what}: heads {past} are out of range; the point has {n} heads")


__all__ = ["check_heads", "parse_heads"]
