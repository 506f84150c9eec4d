"""`TokenLogits`: a row's logits of chosen tokens and the fp32 logsumexp over the vocabulary,
through the model's lens, so a patching cell returns a few numbers instead of `[vocab]`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ie_core.errors import BadPromptError
from ie_core.ops.vectors import cached, on_device, without_cache
from ie_core.reduce.base import Context, Reducer

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class TokenLogits(Reducer):
    kind: ClassVar[str] = "token_logits"
    ids: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "ids", tuple(int(i) for i in self.ids))

    def check(self, width: int, point: str, vocab: int) -> None:
        if not self.ids or any(not 0 <= i < vocab for i in self.ids):
            raise BadPromptError(
                f"token ids must be within the vocabulary [0, {vocab}), got {list(self.ids)}"
            )

    def apply(self, rows: Tensor, context: Context) -> dict[str, Tensor]:
        logits = context.logits(rows).float()
        # int64 ids on the logits' device, built once per reducer and device
        ids = cached(self, "ids", logits, lambda: on_device(self.ids, logits.new_empty(0).long()))
        return {"selected": logits.index_select(-1, ids), "lse": logits.logsumexp(dim=-1)}

    def row_bytes(self, width: int) -> int:
        return 4 * (len(self.ids) + 1)

    def __getstate__(self) -> dict[str, Any]:
        return without_cache(self)


__all__ = ["TokenLogits"]
