"""`Patch`: set the rows at given positions to given values, the op of activation patching.

Unlike the steering ops (each a delta h + d), it replaces values: a patch writes the given rows
exactly, so patching a run with its own activations is the identity bit for bit. With `heads` it
writes only those heads' columns of a per-head point.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ie_core.errors import SteeringSpecError
from ie_core.ops.base import Op, Replacement
from ie_core.ops.heads import check_heads, parse_heads
from ie_core.ops.values import Vector, absolute_positions, as_row
from ie_core.ops.vectors import cached_vector, head_columns, position_hits

if TYPE_CHECKING:
    from torch import Tensor


def _rows(values: Any) -> tuple[Vector, ...]:
    """`[n, width]` or `[width]` (one row) as tuples of floats; zeros are allowed."""
    ndim = getattr(values, "ndim", None)
    if ndim == 1 or (ndim is None and _flat(values)):
        return (as_row(values, "patch values"),)
    if ndim is not None and ndim != 2:
        raise SteeringSpecError(
            f"patch values must be [positions, width] or [width], got shape "
            f"{tuple(getattr(values, 'shape', ()))}"
        )
    rows = tuple(as_row(r, f"patch values[{i}]") for i, r in enumerate(values))
    if not rows:
        raise SteeringSpecError("patch values are empty")
    widths = {len(r) for r in rows}
    if len(widths) > 1:
        raise SteeringSpecError(f"patch value rows have different widths {sorted(widths)}")
    return rows


def _flat(values: Any) -> bool:
    try:
        first = next(iter(values))
    except (TypeError, StopIteration):
        return True
    return not isinstance(first, Sequence) and getattr(first, "ndim", 0) == 0


@dataclass(frozen=True)
class Patch(Op):
    """Set the rows at `positions` to `values` (`[len(positions), width]`, or one `[width]` row for
    every listed position); `positions=None` sets every position, prompt and generated, to one row.

    Positions are absolute sequence positions. With `heads` (and `head_dim`) only those heads'
    columns are written; `values` still has the point's full width (the other columns are unused).
    """

    values: Any
    positions: tuple[int, ...] | None = None
    heads: tuple[int, ...] = ()
    head_dim: int | None = None
    kind: Literal["patch"] = field(default="patch", init=False)

    def __post_init__(self) -> None:
        rows = _rows(self.values)
        positions = absolute_positions(self.positions, "patch", "to patch every position")
        if positions is not None:
            if len(rows) not in (1, len(positions)):
                raise SteeringSpecError(
                    f"patch has {len(rows)} value rows for {len(positions)} positions; give one "
                    "row per position or a single row for all"
                )
        elif len(rows) != 1:
            raise SteeringSpecError(
                f"patch with positions=None takes one [width] row (it sets every position), got "
                f"{len(rows)} rows; give positions=(...) with one row each"
            )
        heads, head_dim = parse_heads(self.heads, self.head_dim)
        check_heads(heads, head_dim, len(rows[0]), "patch")
        object.__setattr__(self, "values", rows)
        object.__setattr__(self, "positions", positions)
        object.__setattr__(self, "heads", heads)
        object.__setattr__(self, "head_dim", head_dim)

    def first_position(self) -> int:
        return 0 if self.positions is None else min(self.positions)

    @property
    def width(self) -> int:
        return len(self.values[0])

    def peak(self) -> tuple[float, str]:
        peak = max(abs(x) for row in self.values for x in row)
        return peak, f"patch value {peak:g}"

    def check_width(self, width: int, where: str) -> None:
        check_heads(self.heads, self.head_dim, width, f"{where}: {self.kind}")

    def rows(self, positions: Tensor | None, x: Tensor) -> tuple[Tensor, Tensor]:
        """(values `[..., width]` fp32, hit `[...]` bool): the row each position gets, and where."""
        values = cached_vector(self, "values", self.values, x)
        if self.positions is None:
            return values[0].expand_as(x), x.new_ones(x.shape[:-1]).bool()
        match = position_hits(self.positions, positions, x, "a Patch", owner=self)  # [..., m]
        assert positions is not None  # position_hits refused None
        index = match.int().argmax(-1) if values.shape[0] > 1 else positions.long().mul(0)
        return values[index.to(x.device)], match.any(-1)

    def apply(self, x: Tensor, positions: Tensor | None) -> Tensor:
        values, hit = self.rows(positions, x)
        cols = head_columns(self.heads, self.head_dim, x.shape[-1], x)
        where = hit.unsqueeze(-1) if cols is None else hit.unsqueeze(-1) & cols
        return values.where(where, x)

    def replacement(self, width: int, like: Tensor) -> Replacement:
        cols = head_columns(self.heads, self.head_dim, width, like)
        values = like.new_tensor(self.values).float()
        if cols is None:
            return Replacement(like.new_zeros(width), values, self.positions)
        return Replacement(
            like.new_ones(width).masked_fill(cols, 0.0), values.where(cols, 0.0), self.positions
        )

    def patch_rows(self) -> int:
        return 1 if self.positions is None else len(self.positions)

    def row_for(self, position: int) -> Vector | None:
        """The row written at `position`, or None where this patch leaves it alone."""
        if self.positions is None:
            return self.values[0]
        if position not in self.positions:
            return None
        return (
            self.values[0] if len(self.values) == 1 else self.values[self.positions.index(position)]
        )

    @classmethod
    def from_cache(
        cls,
        cache: Any,
        address: Any,
        positions: Sequence[int] | int,
        *,
        batch: int = 0,
        heads: Sequence[int] = (),
        head_dim: int | None = None,
    ) -> Patch:
        """The rows of `cache[address][batch]` at `positions`, to write at the same positions."""
        if isinstance(positions, int):
            positions = (positions,)
        tensor = cache[address]
        if getattr(tensor, "ndim", 0) != 3:
            raise SteeringSpecError(
                f"{address}: a patch is taken from a [batch, seq, width] capture, got shape "
                f"{tuple(getattr(tensor, 'shape', ()))}"
            )
        seq = tensor.shape[1]
        past = [p for p in positions if not 0 <= p < seq]
        if past:
            raise SteeringSpecError(
                f"positions {past} are outside the cached prompt (positions 0..{seq - 1})"
            )
        rows = tensor[batch, list(positions)].float()
        return cls(rows, tuple(positions), tuple(heads), head_dim)


__all__ = ["Patch"]
