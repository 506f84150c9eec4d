"""Reducers: what shrinks a point's rows to a small result where the rows live, one module per
kind (laid out like `ie_core.ops`): `base` (the interface, `Reduction`, `Context`), `kinds` (the
registry), `host` (the host fallback and the results' flat form)."""

from ie_core.reduce.atlas_topk import AtlasTopK
from ie_core.reduce.base import Context, Reducer, Reduction
from ie_core.reduce.cast import Cast
from ie_core.reduce.dictionary import DictionaryFeatures
from ie_core.reduce.host import flat, nested, pad_cat, per_prompt, reduce_cache
from ie_core.reduce.kinds import REDUCER_KINDS, reducer_from_dict, reduction_from_dict
from ie_core.reduce.lens_topk import LensTopK
from ie_core.reduce.probe import ProbeScores
from ie_core.reduce.token_logits import TokenLogits

__all__ = [
    "REDUCER_KINDS",
    "AtlasTopK",
    "Cast",
    "Context",
    "DictionaryFeatures",
    "LensTopK",
    "ProbeScores",
    "Reducer",
    "Reduction",
    "TokenLogits",
    "flat",
    "nested",
    "pad_cat",
    "per_prompt",
    "reduce_cache",
    "reducer_from_dict",
    "reduction_from_dict",
]
