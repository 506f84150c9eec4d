"""`DictionaryFeatures`: a dictionary's (SAE / transcoder) features of each row: dense, or top-k
ids / values, with the reconstruction statistics on request (`ie_core.experiments.sae_math`).

The dictionary is named by a string: a content key where it was sent ahead (a vLLM worker holds
it by key), or a served name over HTTP (the server resolves it). A loaded `SAE` rides along
in-process (`sae`, not part of the wire form or equality)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from ie_core.errors import DictionaryShapeError
from ie_core.reduce.base import Context, Reducer

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class DictionaryFeatures(Reducer):
    kind: ClassVar[str] = "sae"
    dictionary: str
    k: int | None = None
    stats: bool = False
    sae: Any = field(default=None, compare=False, repr=False)

    def apply(self, rows: Tensor, context: Context) -> dict[str, Tensor]:
        w, meta = (
            (self.sae.weights, self.sae.meta)
            if self.sae is not None
            else context.dictionary(self.dictionary)
        )
        from ie_core.experiments.sae_math import reduce_rows  # torch at import: not for a plan

        return reduce_rows(rows.to(w["W_enc"].device), w, meta, self.k, self.stats)

    def check(self, width: int, point: str, vocab: int) -> None:
        if self.sae is not None and self.sae.d_in != width:
            raise DictionaryShapeError(
                f"{self.sae.name or 'the dictionary'} reads {self.sae.d_in}-wide rows but {point} "
                f"is {width} wide on this model; load the dictionary trained for this model"
            )

    def row_bytes(self, width: int) -> int:
        width = self.sae.d_sae if self.sae is not None else 0
        return (12 * self.k if self.k is not None else 4 * width) + (8 if self.stats else 0)

    def portable(self) -> bool:
        return self.sae is None


__all__ = ["DictionaryFeatures"]
