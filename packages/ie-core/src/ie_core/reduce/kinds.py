"""The registry of reducer kinds: a new reducer is its own module plus one line here."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from ie_core.reduce.atlas_topk import AtlasTopK
from ie_core.reduce.base import Reducer, Reduction
from ie_core.reduce.cast import Cast
from ie_core.reduce.dictionary import DictionaryFeatures
from ie_core.reduce.lens_topk import LensTopK
from ie_core.reduce.probe import ProbeScores
from ie_core.reduce.token_logits import TokenLogits

_ALL: tuple[type[Reducer], ...] = (
    TokenLogits, ProbeScores, DictionaryFeatures, Cast, LensTopK, AtlasTopK,
)  # fmt: skip

REDUCER_KINDS: Mapping[str, type[Reducer]] = MappingProxyType({cls.kind: cls for cls in _ALL})


def reducer_from_dict(data: Mapping[str, Any]) -> Reducer:
    """A reducer from its wire form: `{"kind": "token_logits", "ids": [3, 5]}`."""
    data = dict(data)
    kind = data.pop("kind", None)
    cls = REDUCER_KINDS.get(str(kind))
    if cls is None:
        raise ValueError(f"unknown reducer {kind!r}; use one of {', '.join(REDUCER_KINDS)}")
    try:
        return cls.from_wire(data)
    except (TypeError, KeyError) as exc:
        raise ValueError(f"bad fields for reducer {kind!r}: {exc}") from None


def reduction_from_dict(data: Any) -> Reduction:
    if not isinstance(data, Mapping):
        raise ValueError(f"a reduction is a JSON object, got {data!r:.80}")
    try:
        reducer = reducer_from_dict(data["reducer"])
        return Reduction(str(data["address"]), reducer, str(data["label"]), bool(data["last"]))
    except KeyError as exc:
        raise ValueError(f"a reduction lacks the field {exc}") from None


__all__ = ["REDUCER_KINDS", "reducer_from_dict", "reduction_from_dict"]
