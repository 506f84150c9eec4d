"""Vectors as the ops' maths needs them, built with tensor methods from a template tensor (`like`:
fp32, on the rows' device), so the op modules never import torch themselves."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ie_core.ops.values import VectorLike

if TYPE_CHECKING:
    from torch import Tensor


def unit(values: VectorLike, like: Tensor) -> Tensor:
    """values / |values| in fp32 on `like`'s device (finite, non-zero in fp32, as specs are).

    The vector is first scaled by a power of two that brings its largest entry near 1: exact in
    binary floating point, so normal-range vectors give bit for bit `v / v.norm()`, while tiny or
    huge ones no longer under- or overflow in the squares of the norm (which gave NaN or zero)."""
    v = like.new_tensor(values).float()
    peak = float(v.abs().max())
    if peak > 0:
        # In float64, since 2**-exponent of a subnormal fp32 peak is beyond fp32's range.
        v = (v.double() * 2.0 ** -math.frexp(peak)[1]).float()
    return v / v.norm()


def vector(values: VectorLike, like: Tensor) -> Tensor:
    """`values` as an fp32 tensor on `like`'s device."""
    return like.new_tensor(values).float()


def row_norm(h: Tensor) -> Tensor:
    """|h| per row ([..., 1]), scaled by a power of two per row like `unit`, so a row whose
    entries are finite but near fp32's top (1.8e19 squared overflows) gets a finite norm."""
    _, exponent = h.abs().amax(dim=-1, keepdim=True).frexp()
    return h.ldexp(-exponent).norm(dim=-1, keepdim=True).ldexp(exponent)


def position_hits(
    wanted: tuple[int, ...], positions: Tensor | None, like: Tensor, what: str
) -> Tensor:
    """Bool `[..., len(wanted)]`: which of the absolute positions `wanted` each row is at, given
    the rows' positions `[...]`; `what` names the op that needs them."""
    if positions is None:
        raise RuntimeError(f"{what} at given positions needs the rows' positions")
    want = positions.new_tensor(wanted).long().to(like.device)
    return positions.to(like.device).long().unsqueeze(-1) == want


def head_columns(
    heads: tuple[int, ...], head_dim: int | None, width: int, like: Tensor
) -> Tensor | None:
    """Bool `[width]`: the columns of `heads` (None when the op targets every column)."""
    if not heads or head_dim is None:
        return None
    cols = like.new_zeros(width).bool()
    for h in heads:
        cols[h * head_dim : (h + 1) * head_dim] = True
    return cols


__all__ = ["head_columns", "position_hits", "row_norm", "unit", "vector"]
