"""`LensTopK`: the lens read-out of each row: the top-k token ids and their probabilities, the
probabilities from an fp32 logsumexp over the full vocabulary."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from ie_core.reduce.base import Context, Reducer

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class LensTopK(Reducer):
    kind: ClassVar[str] = "lens_topk"
    k: int

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or isinstance(self.k, bool) or self.k < 1:
            raise ValueError(f"k must be a positive int, got {self.k!r}")

    def apply(self, rows: Tensor, context: Context) -> dict[str, Tensor]:
        return self.of_logits(context.logits(rows))

    def of_logits(self, logits: Tensor) -> dict[str, Tensor]:
        """The read-out of logits already computed (`[..., vocab]`)."""
        flat = logits.float().reshape(-1, logits.shape[-1])
        top, ids = flat.topk(min(self.k, flat.shape[-1]), dim=-1)
        return {"ids": ids, "probs": (top - flat.logsumexp(dim=-1, keepdim=True)).exp()}

    def row_bytes(self, width: int) -> int:
        return 12 * self.k


__all__ = ["LensTopK"]
