"""`LensSteer`: push h along a j-lens direction in proportion to |h|."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from ie_core.errors import SteeringSpecError
from ie_core.ops.base import AffineForm, Op
from ie_core.ops.values import VectorLike, as_vector, real_number
from ie_core.ops.vectors import cached_unit, row_norm, unit

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class LensSteer(Op):
    """j-lens steer: delta = strength * |h| * d^, rescaled so |delta| <= max_fraction * |h|."""

    direction: VectorLike
    strength: float = 1.0
    max_fraction: float = 1.0
    kind: Literal["lens_steer"] = field(default="lens_steer", init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "direction", as_vector(self.direction, "direction"))
        object.__setattr__(self, "strength", real_number(self.strength, "strength"))
        frac = real_number(self.max_fraction, "max_fraction")
        if frac <= 0:
            raise SteeringSpecError(f"max_fraction must be > 0, got {frac}")
        object.__setattr__(self, "max_fraction", frac)

    @property
    def width(self) -> int:
        return len(self.direction)

    @property
    def clamped_strength(self) -> float:
        """|strength * |h| * d| = |strength| * |h| (d is a unit vector), so the rescale to
        max_fraction * |h| is a clamp of the strength; clamping first cannot overflow to inf*0."""
        return max(-self.max_fraction, min(self.max_fraction, self.strength))

    def delta(self, h: Tensor) -> Tensor:
        d = cached_unit(self, "direction", self.direction, h)
        return self.clamped_strength * row_norm(h) * d

    def affine(self, like: Tensor) -> AffineForm:
        d = unit(self.direction, like)
        return AffineForm(u=like.new_zeros(self.width), w=d, gamma=self.clamped_strength)
