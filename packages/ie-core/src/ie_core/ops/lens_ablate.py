"""`LensAblate`: remove the component of h along a j-lens direction."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from ie_core.ops.base import AffineForm, Op
from ie_core.ops.values import VectorLike, as_vector
from ie_core.ops.vectors import cached_unit, unit

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class LensAblate(Op):
    """j-lens ablate: delta = -(h . d^) d^."""

    direction: VectorLike
    kind: Literal["lens_ablate"] = field(default="lens_ablate", init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "direction", as_vector(self.direction, "direction"))

    @property
    def width(self) -> int:
        return len(self.direction)

    def delta(self, h: Tensor) -> Tensor:
        d = cached_unit(self, "direction", self.direction, h)
        return -(h @ d).unsqueeze(-1) * d

    def affine(self, like: Tensor) -> AffineForm:
        d = unit(self.direction, like)
        return AffineForm(u=d, w=d, alpha=-1.0)
