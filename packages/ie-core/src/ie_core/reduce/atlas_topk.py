"""`AtlasTopK`: a dictionary's per-feature atlas statistics of one request's rows, reduced where
the rows live: each feature's top-k (value, position), firing count, fp64 sum, histogram and
band samples (`ie_core.atlas.state`), so only those leave the worker, not `[tokens, d_sae]`:
sparse records of what fired (`ie_core.atlas.partial`).

Unlike the per-row reducers it summarises: `apply_at` gives one entry per call (a forward's
chunk of one request, from position `first`), and `join` merges a request's entries into one.
Rows at positions below `skip` (an added BOS, not corpus text) are not read. The dictionary
is named by its content key as `DictionaryFeatures`' is (a loaded `SAE` rides along
in-process); the maths is `ie_core.atlas.partial`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from ie_core.errors import DictionaryShapeError
from ie_core.reduce.base import Context, Reducer

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class AtlasTopK(Reducer):
    kind: ClassVar[str] = "atlas_topk"
    per_row: ClassVar[bool] = False
    dictionary: str
    k: int
    samples: int = 4
    binning: tuple[int, int, int] = (4, -10, 10)  # per_octave, low, high (`atlas.state.Binning`)
    skip: int = 0
    sae: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        ints = (self.k, self.samples, self.skip, *self.binning)
        if any(not isinstance(v, int) or isinstance(v, bool) for v in ints) or len(
            self.binning
        ) != 3:  # fmt: skip
            raise ValueError(f"k, samples, skip and the 3 binning fields are ints, got {self}")
        if self.k < 1 or self.samples < 0 or self.skip < 0:
            raise ValueError(f"need k >= 1, samples >= 0, skip >= 0; got {self}")

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Reducer:
        return cls(**{**data, "binning": tuple(data.get("binning", (4, -10, 10)))})

    def apply(self, rows: Tensor, context: Context) -> dict[str, Tensor]:
        return self.apply_at(rows, 0, context)

    def apply_at(self, rows: Tensor, first: int, context: Context) -> dict[str, Tensor]:
        from ie_core.atlas.partial import chunk_outputs  # torch at import: not for a plan
        from ie_core.atlas.state import Binning
        from ie_core.experiments.sae_math import encode

        w, meta = (
            (self.sae.weights, self.sae.meta)
            if self.sae is not None
            else context.dictionary(self.dictionary)
        )
        drop = min(max(self.skip - first, 0), int(rows.shape[0]))
        acts = encode(rows[drop:].to(w["W_enc"].device), w, meta)
        return chunk_outputs(acts, first + drop, self.k, self.samples, Binning(*self.binning))

    def join(self, outputs: Mapping[str, Tensor]) -> dict[str, Tensor]:
        from ie_core.atlas.partial import join
        from ie_core.atlas.state import Binning

        return join(outputs, self.k, self.samples, Binning(*self.binning))

    def check(self, width: int, point: str, vocab: int) -> None:
        if self.sae is not None and self.sae.d_in != width:
            raise DictionaryShapeError(
                f"{self.sae.name or 'the dictionary'} reads {self.sae.d_in}-wide rows but {point} "
                f"is {width} wide on this model; load the dictionary trained for this model"
            )

    def row_bytes(self, width: int) -> int:
        """The most bytes one entry takes (a chunk of at least one row: a bound per row), every
        slot filled; a sparse entry takes 12 bytes per top-k or band-sample record, 8 per
        non-empty bin and 12 per fired feature."""
        d = self.sae.d_sae if self.sae is not None else 0
        per_octave, low, high = self.binning
        bins, bands = (high - low) * per_octave + 2, high - low + 2
        return d * (12 * self.k + 12 * bands * self.samples + 8 * bins + 12) + 48

    def portable(self) -> bool:
        return self.sae is None


__all__ = ["AtlasTopK"]
