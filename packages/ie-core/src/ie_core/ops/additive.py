"""`Additive`: h + coeff * vector, the steering vector."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, cast

from ie_core.errors import SteeringSpecError
from ie_core.ops.base import AffineForm, Op
from ie_core.ops.values import FLOAT32_MAX, VectorLike, as_vector, real_number
from ie_core.ops.vectors import cached_vector, vector

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class Additive(Op):
    """delta = coeff * vector."""

    vector: VectorLike
    coeff: float = 1.0
    kind: Literal["additive"] = field(default="additive", init=False)

    def __post_init__(self) -> None:
        vec = as_vector(self.vector)
        coeff = real_number(self.coeff, "coeff")
        peak = abs(coeff) * max(abs(x) for x in vec)
        if peak > FLOAT32_MAX:
            raise SteeringSpecError(
                f"coeff * vector reaches {peak:g}, which overflows float32 (max "
                f"{FLOAT32_MAX:.4g}), the dtype the steering math runs in; use a smaller coeff"
            )
        object.__setattr__(self, "vector", vec)
        object.__setattr__(self, "coeff", coeff)

    @property
    def width(self) -> int:
        return len(self.vector)

    def peak(self) -> tuple[float, str]:
        peak = abs(self.coeff) * max(abs(x) for x in cast("tuple[float, ...]", self.vector))
        return peak, f"additive delta reaches {peak:g}"

    def delta(self, h: Tensor) -> Tensor:
        return (self.coeff * cached_vector(self, "vector", self.vector, h)).expand_as(h)

    def affine(self, like: Tensor) -> AffineForm:
        return AffineForm(
            u=like.new_zeros(self.width), w=self.coeff * vector(self.vector, like), const=1.0
        )
