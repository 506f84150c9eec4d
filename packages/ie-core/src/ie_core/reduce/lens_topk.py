"""`LensTopK`: the lens read-out of each row: the top-k token ids and their probabilities, the
probabilities from an fp32 logsumexp over the full vocabulary. A Jacobian lens's `transport`
(`[d_model, d_model]`, J_L) carries each row first; it rides in-process only (not in the wire form,
so a plan holding one is not portable)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from ie_core.reduce.base import Context, Reducer

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class LensTopK(Reducer):
    kind: ClassVar[str] = "lens_topk"
    k: int
    transport: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or isinstance(self.k, bool) or self.k < 1:
            raise ValueError(f"k must be a positive int, got {self.k!r}")

    def apply(self, rows: Tensor, context: Context) -> dict[str, Tensor]:
        return self.of_logits(context.logits(self.carried(rows)))

    def carried(self, rows: Tensor) -> Tensor:
        """The rows the lens reads: carried by the transport where there is one."""
        if self.transport is None:
            return rows
        return rows.float() @ self.transport.to(rows.device).T

    def of_logits(self, logits: Tensor) -> dict[str, Tensor]:
        """The read-out of logits already computed (`[..., vocab]`)."""
        flat = logits.float().reshape(-1, logits.shape[-1])
        top, ids = flat.topk(min(self.k, flat.shape[-1]), dim=-1)
        return {"ids": ids, "probs": (top - flat.logsumexp(dim=-1, keepdim=True)).exp()}

    def row_bytes(self, width: int) -> int:
        return 12 * self.k

    def portable(self) -> bool:
        return self.transport is None


__all__ = ["LensTopK"]
