"""What every reducer is: a frozen spec that owns the maths shrinking a point's rows to a small
result where the rows live (a worker, eager's forward, or the host as the fallback).

A reducer knows its kind, `apply(rows, context)` (rows `[n, width]` to named tensors with `n`
leading), its wire form (plain JSON, read back by `ie_core.reduce.kinds.reducer_from_dict`) and
the bytes per row its result takes. What differs by where it runs (the model's lens, the
dictionaries held there) comes in a `Context`. The maths uses tensor methods only, so importing a
reducer's spec here imports no torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from torch import Tensor

    from ie_core.experiments.sae_math import DictMeta

Lens = Callable[["Tensor"], "Tensor"]
Dictionary = tuple[Mapping[str, "Tensor"], "DictMeta"]


@dataclass(frozen=True)
class Context:
    """Where a reducer runs: the model's lens (final norm and unembed, with the family's scale
    and softcap) and the dictionaries held there by key; `no_lens` says why there is no lens."""

    lens: Lens | None = None
    dictionaries: Callable[[str], Dictionary] | None = None
    no_lens: str = "this backend gave the reducer no lens"

    def logits(self, rows: Tensor) -> Tensor:
        if self.lens is None:
            raise RuntimeError(self.no_lens)
        return self.lens(rows)

    def dictionary(self, key: str) -> Dictionary:
        if self.dictionaries is None:
            raise KeyError(f"dictionary {key!r} is held nowhere here")
        return self.dictionaries(key)


@dataclass(frozen=True)
class Reducer:
    """The interface; each kind is a frozen dataclass in its own module of `ie_core.reduce`."""

    kind: ClassVar[str] = ""
    # False for a reducer that summarises a request's rows (one entry per call, `join`ed).
    per_row: ClassVar[bool] = True

    def apply(self, rows: Tensor, context: Context) -> dict[str, Tensor]:
        """Named outputs, each with `rows.shape[0]` leading (one entry per row)."""
        raise NotImplementedError

    def apply_at(self, rows: Tensor, first: int, context: Context) -> dict[str, Tensor]:
        """`apply` on one request's rows from position `first` on (a summarising reducer reads
        the positions; a per-row one does not)."""
        return self.apply(rows, context)

    def join(self, outputs: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """A summarising reducer: one request's entries (one per `apply_at`) as one entry."""
        raise NotImplementedError(f"reducer {self.kind!r} keeps one entry per row")

    def row_bytes(self, width: int) -> int:
        """Bytes of the result per row of `width` (a server bounds its response with it)."""
        raise NotImplementedError

    def check(self, width: int, point: str, vocab: int) -> None:
        """Refuse, before any forward, rows this reducer cannot read (`width` wide at `point`)
        or tokens outside the model's `vocab`."""

    def portable(self) -> bool:
        """Whether the wire form carries all the reducer needs (a loaded dictionary does not:
        it travels to a vLLM worker by content key, and over HTTP only by a served name)."""
        return True

    def to_wire(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.compare}
        return {"kind": self.kind, **{k: _plain(v) for k, v in data.items()}}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Reducer:
        return cls(**data)


def _plain(value: Any) -> Any:
    return [_plain(v) for v in value] if isinstance(value, tuple) else value


@dataclass(frozen=True)
class Reduction:
    """`reducer` over the rows of `address`, its outputs named `label|<output>`; `last` reads
    each prompt's final row only (a result `[batch, ...]`, else `[batch, seq, ...]`). A served
    dictionary named over HTTP has no address until the server resolves its name (`""`)."""

    address: str
    reducer: Reducer
    label: str
    last: bool = False

    def to_wire(self) -> dict[str, Any]:
        return {"address": self.address, "label": self.label, "last": self.last,
                "reducer": self.reducer.to_wire()}  # fmt: skip


__all__ = ["Context", "Dictionary", "Lens", "Reducer", "Reduction"]
