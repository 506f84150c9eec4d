"""`ProjectionCap`: clamp the projection of h on a direction into a range."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from ie_core.errors import SteeringSpecError
from ie_core.ops.base import AffineForm, Op
from ie_core.ops.values import VectorLike, as_vector, real_number
from ie_core.ops.vectors import cached_unit, unit

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class ProjectionCap(Op):
    """Clamp the projection p = h . u into [min, max] (either bound may be None)."""

    vector: VectorLike
    min: float | None = None
    max: float | None = None
    kind: Literal["projection_cap"] = field(default="projection_cap", init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "vector", as_vector(self.vector))
        if self.min is None and self.max is None:
            raise SteeringSpecError("projection cap needs min, max or both")
        lo = None if self.min is None else real_number(self.min, "min")
        hi = None if self.max is None else real_number(self.max, "max")
        if lo is not None and hi is not None and lo > hi:
            raise SteeringSpecError(f"projection cap min {lo} is above max {hi}")
        object.__setattr__(self, "min", lo)
        object.__setattr__(self, "max", hi)

    @property
    def width(self) -> int:
        return len(self.vector)

    def peak(self) -> tuple[float, str]:
        peak = max(abs(b) for b in (self.min, self.max) if b is not None)
        return peak, f"projection bound {peak:g}"

    def delta(self, h: Tensor) -> Tensor:
        u = cached_unit(self, "vector", self.vector, h)
        p = h @ u
        return (p.clamp(min=self.min, max=self.max) - p).unsqueeze(-1) * u

    def affine(self, like: Tensor) -> AffineForm:
        u = unit(self.vector, like)
        lo = -math.inf if self.min is None else self.min
        hi = math.inf if self.max is None else self.max
        return AffineForm(u=u, w=u, beta=1.0, lo=lo, hi=hi)
