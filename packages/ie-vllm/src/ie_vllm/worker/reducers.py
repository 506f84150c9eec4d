"""In-worker reductions: a request may name reducers beside its captures; each is a registered
function of one point's rows, run where the rows live, whose small result is stored (by position,
as captured rows are) and collected instead of the dense rows.

`REDUCERS` maps a kind to its function. Kinds here: `cast` (rows in another dtype, for harvest
shards), `sae` (dictionary features: dense, or top-k ids / values, optionally the
reconstruction statistics), `probe` (a linear probe's per-token scores) and `token_logits` (a
terminal reducer: the final logits of chosen tokens and the logsumexp over the vocabulary, through
the model's own lens, so a patching cell returns a few numbers, not `[vocab]`). Dictionaries are
sent once per worker process by content key (`put_dictionary`) and named by that key in a
reducer's params, never shipped per request. A reducer whose params name a `position` reads that
position's row only. Jobs at one site in one forward that share a kind and params run as one
batched call.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from ie_core.experiments.probes import Probe
from ie_core.experiments.sae_math import DictMeta, reduce_rows

from ie_vllm.specs import ReducerSpec
from ie_vllm.worker.layout import RequestRows
from ie_vllm.worker.transfer import to_device

Reducer = Callable[[torch.Tensor, Mapping[str, Any]], dict[str, torch.Tensor]]
Lens = Callable[[torch.Tensor], torch.Tensor]

# The worker's lens (final norm, unembed with the family's scale and softcap), set at `ie_setup`
# on the pipeline stage that holds the final norm.
_LENS: list[Lens] = []


def use_lens(lens: Lens) -> None:
    _LENS[:] = [lens]


# Dictionaries held by this worker process, by content key: (tensors on the model's device, meta).
DICTIONARIES: dict[str, tuple[dict[str, torch.Tensor], DictMeta]] = {}


def put_dictionary(
    key: str, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any], device: Any
) -> None:
    """Keep a dictionary for later requests (idempotent: the key is a content digest)."""
    if key not in DICTIONARIES:
        w = {n: t.to(device=device, dtype=torch.float32) for n, t in tensors.items()}
        DICTIONARIES[key] = (w, DictMeta.from_dict(meta))


def _sae(rows: torch.Tensor, params: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    got = DICTIONARIES.get(str(params["dictionary"]))
    if got is None:
        raise KeyError(f"dictionary {params['dictionary']!r} was not sent to this worker")
    w, meta = got
    k = params.get("k")
    return reduce_rows(rows.to(w["W_enc"].device), w, meta, None if k is None else int(k),
                       bool(params.get("stats", False)))  # fmt: skip


_CAST_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _cast(rows: torch.Tensor, params: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    return {"rows": rows.to(_CAST_DTYPES[str(params["dtype"])])}


# What a reducer builds from its params once, not at every step: probes by the params they came
# from (held here, so an id is never reused while its entry lives), token ids by value (the cells
# of a sweep share them). Bounded: an evicted entry is rebuilt on its next use.
_KEPT_MAX = 256
_PROBES: OrderedDict[int, tuple[Mapping[str, Any], Probe]] = OrderedDict()
_IDS: OrderedDict[tuple[tuple[int, ...], str], torch.Tensor] = OrderedDict()


def _kept(store: OrderedDict[Any, Any], key: Any, build: Callable[[], Any]) -> Any:
    got = store.get(key)
    if got is None:
        got = store[key] = build()
        if len(store) > _KEPT_MAX:
            store.popitem(last=False)
    else:
        store.move_to_end(key)
    return got


def _probe_of(params: Mapping[str, Any]) -> Probe:
    """The params' `Probe`, built once; it keeps its weight on the device (`Probe.scores`)."""
    return _kept(_PROBES, id(params), lambda: (params, Probe.from_params(params)))[1]


def _probe(rows: torch.Tensor, params: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """A linear probe's scores (`Probe.scores`; the host checked the shapes before sending)."""
    return {"scores": _probe_of(params).scores(rows)}


def _token_logits(rows: torch.Tensor, params: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Logits of `params["ids"]` and the fp32 logsumexp over the vocabulary, per row."""
    if not _LENS:
        raise RuntimeError("this worker holds no final norm (not the last pipeline stage)")
    logits = _LENS[0](rows).float()
    wanted = tuple(int(i) for i in params["ids"])
    ids = _kept(
        _IDS,
        (wanted, str(logits.device)),
        lambda: to_device(torch.tensor(wanted, dtype=torch.int64), logits.device),
    )
    return {"selected": logits.index_select(-1, ids), "lse": torch.logsumexp(logits, dim=-1)}


REDUCERS: dict[str, Reducer] = {
    "sae": _sae,
    "cast": _cast,
    "probe": _probe,
    "token_logits": _token_logits,
}


def rows_for(
    spec: ReducerSpec, r: RequestRows, site: torch.Tensor
) -> tuple[int, torch.Tensor] | None:
    """The rows of one request a reducer reads in this forward, with the first one's position:
    all of them, or the row at `params["position"]` (None when this forward does not hold it)."""
    at = spec.params.get("position")
    if at is None:
        return r.first_pos, site[r.start : r.end]
    offset = int(at) - r.first_pos
    if not 0 <= offset < r.n:
        return None
    return int(at), site[r.start + offset : r.start + offset + 1]


def run(jobs: Sequence[tuple[ReducerSpec, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
    """Each job's outputs (in job order); jobs of one group are concatenated into one call."""
    groups: dict[str, list[int]] = {}
    for i, (spec, _) in enumerate(jobs):
        groups.setdefault(spec.group(), []).append(i)
    results: list[dict[str, torch.Tensor]] = [{} for _ in jobs]
    for members in groups.values():
        spec = jobs[members[0]][0]
        fn = REDUCERS[spec.kind]
        sizes = [jobs[i][1].shape[0] for i in members]
        whole = fn(torch.cat([jobs[i][1] for i in members]), spec.params)
        for name, t in whole.items():
            for i, part in zip(members, torch.split(t, sizes), strict=True):
                results[i][name] = part
    return results


__all__ = ["DICTIONARIES", "REDUCERS", "put_dictionary", "rows_for", "run", "use_lens"]
