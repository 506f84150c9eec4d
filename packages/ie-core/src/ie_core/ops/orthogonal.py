"""`Orthogonal`: scale the component of h along a direction (0 ablates it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from ie_core.ops.base import AffineForm, Op
from ie_core.ops.values import VectorLike, as_vector, real_number
from ie_core.ops.vectors import cached_unit, unit

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class Orthogonal(Op):
    """Scale the component along u = v/|v| by coeff: 0 ablates it, 1 is a no-op."""

    vector: VectorLike
    coeff: float = 0.0
    kind: Literal["orthogonal"] = field(default="orthogonal", init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "vector", as_vector(self.vector))
        object.__setattr__(self, "coeff", real_number(self.coeff, "coeff"))

    @property
    def width(self) -> int:
        return len(self.vector)

    def delta(self, h: Tensor) -> Tensor:
        u = cached_unit(self, "vector", self.vector, h)
        return (self.coeff - 1.0) * (h @ u).unsqueeze(-1) * u

    def affine(self, like: Tensor) -> AffineForm:
        u = unit(self.vector, like)
        return AffineForm(u=u, w=u, alpha=self.coeff - 1.0)
