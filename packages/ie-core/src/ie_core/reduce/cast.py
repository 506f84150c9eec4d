"""`Cast`: the rows themselves in another dtype (harvest's shards store rows at their disk
dtype; cast where the rows live, half as many bytes cross)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from ie_core.reduce.base import Context, Reducer

if TYPE_CHECKING:
    from torch import Tensor

DTYPES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class Cast(Reducer):
    kind: ClassVar[str] = "cast"
    dtype: str

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"cast to one of {', '.join(DTYPES)}, got {self.dtype!r}")

    def apply(self, rows: Tensor, context: Context) -> dict[str, Tensor]:
        return {"rows": {"float32": rows.float, "bfloat16": rows.bfloat16,
                         "float16": rows.half}[self.dtype]()}  # fmt: skip

    def row_bytes(self, width: int) -> int:
        return DTYPES[self.dtype] * width


__all__ = ["Cast"]
