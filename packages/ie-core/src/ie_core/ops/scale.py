"""`Scale`: multiply h (or some heads' columns of it) by a factor; `Scale(0.0)` is zero ablation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from ie_core.ops.base import Op, Replacement
from ie_core.ops.heads import check_heads, parse_heads
from ie_core.ops.values import real_number
from ie_core.ops.vectors import head_columns

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class Scale(Op):
    """h <- factor * h (on `heads` only, when given): `Scale(0.0)` is zero ablation."""

    factor: float
    heads: tuple[int, ...] = ()
    head_dim: int | None = None
    kind: Literal["scale"] = field(default="scale", init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "factor", real_number(self.factor, "factor"))
        heads, head_dim = parse_heads(self.heads, self.head_dim)
        object.__setattr__(self, "heads", heads)
        object.__setattr__(self, "head_dim", head_dim)

    @property
    def width(self) -> None:
        return None  # a factor fits any width

    def check_width(self, width: int, where: str) -> None:
        check_heads(self.heads, self.head_dim, width, f"{where}: {self.kind}")

    def apply(self, x: Tensor, positions: Tensor | None) -> Tensor:
        cols = head_columns(self.heads, self.head_dim, x.shape[-1], x)
        return x * self.factor if cols is None else (x * self.factor).where(cols, x)

    def replacement(self, width: int, like: Tensor) -> Replacement:
        cols = head_columns(self.heads, self.head_dim, width, like)
        mul = like.new_full((width,), self.factor)
        return Replacement(mul if cols is None else mul.where(cols, 1.0))


__all__ = ["Scale"]
