"""`LensSwap`: move the mass of h on one j-lens direction to another."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from ie_core.errors import SteeringSpecError
from ie_core.ops.base import AffineForm, Op
from ie_core.ops.values import VectorLike, as_vector
from ie_core.ops.vectors import cached_unit, unit

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class LensSwap(Op):
    """j-lens swap: delta = (h . s^)(t^ - s^), moving the source direction's mass to the target."""

    source: VectorLike
    target: VectorLike
    kind: Literal["lens_swap"] = field(default="lens_swap", init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "source", as_vector(self.source, "source"))
        object.__setattr__(self, "target", as_vector(self.target, "target"))
        if len(self.source) != len(self.target):
            raise SteeringSpecError(
                f"swap source has width {len(self.source)} but target has {len(self.target)}"
            )

    @property
    def width(self) -> int:
        return len(self.source)

    def delta(self, h: Tensor) -> Tensor:
        s = cached_unit(self, "source", self.source, h)
        t = cached_unit(self, "target", self.target, h)
        return (h @ s).unsqueeze(-1) * (t - s)

    def affine(self, like: Tensor) -> AffineForm:
        s, t = unit(self.source, like), unit(self.target, like)
        return AffineForm(u=s, w=t - s, alpha=1.0)
