"""Interventions that set or scale activations, the ops of causal experiments: `Patch`, `Scale`.

Unlike the steering ops (each a delta h + d), these replace values: a patch writes the given rows
exactly, a scale multiplies in one rounding, so patching a run with its own activations is the
identity bit for bit. Both can target heads of a per-head point (`z`, `value`, ...): the columns
`[h * head_dim, (h + 1) * head_dim)` of each listed head. Torch-free; the math is `steer_math`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ie_core.errors import SteeringSpecError
from ie_core.spec_values import Vector, as_row, integer, real_number


def _heads(heads: Any, head_dim: Any) -> tuple[tuple[int, ...], int | None]:
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
class Patch:
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
        positions = self.positions
        if positions is not None:
            if isinstance(positions, int):
                positions = (positions,)
            positions = tuple(integer(p, "patch position") for p in positions)
            if not positions:
                raise SteeringSpecError(
                    "patch positions are empty; give positions, or None to patch every position"
                )
            if len(set(positions)) != len(positions):
                raise SteeringSpecError(f"patch positions {list(positions)} repeat a position")
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
        heads, head_dim = _heads(self.heads, self.head_dim)
        check_heads(heads, head_dim, len(rows[0]), "patch")
        object.__setattr__(self, "values", rows)
        object.__setattr__(self, "positions", positions)
        object.__setattr__(self, "heads", heads)
        object.__setattr__(self, "head_dim", head_dim)

    @property
    def width(self) -> int:
        return len(self.values[0])

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


@dataclass(frozen=True)
class Scale:
    """h <- factor * h (on `heads` only, when given): `Scale(0.0)` is zero ablation."""

    factor: float
    heads: tuple[int, ...] = ()
    head_dim: int | None = None
    kind: Literal["scale"] = field(default="scale", init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "factor", real_number(self.factor, "factor"))
        heads, head_dim = _heads(self.heads, self.head_dim)
        object.__setattr__(self, "heads", heads)
        object.__setattr__(self, "head_dim", head_dim)


@dataclass(frozen=True)
class Hook:
    """Your own function at a point: `fn(tensor, address) -> tensor | None` (None keeps it).

    It sees the point's rows in fp32 (`[batch, seq, width]` on eager) and runs in this process
    only: eager runs it in its forward; the vLLM backends and HTTP refuse it (their forwards run in
    other processes), so express the intervention as ops there."""

    fn: Callable[[Any, str | None], Any]
    address: str | None = None
    kind: Literal["hook"] = field(default="hook", init=False)

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise SteeringSpecError(f"a Hook needs a callable fn(tensor, address), got {self.fn!r}")


Intervention = Patch | Scale | Hook

__all__ = ["Hook", "Intervention", "Patch", "Scale", "check_heads"]
