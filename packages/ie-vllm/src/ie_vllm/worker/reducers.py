"""In-worker reductions: a request may name reducers (`ie_core.reduce`, one module per kind, the
maths there) beside its captures; each runs on one point's rows where they live, and its small
result is stored (by position, as captured rows are) and collected instead of the dense rows.

What is the worker's own: the lens it holds (final norm, unembed with the family's scale and
softcap, set at `ie_setup` on the pipeline stage that holds the final norm), the dictionaries it
holds by content key (sent once per worker, `put_dictionary`, named by that key in a reducer,
never shipped per request) and the reducers it keeps, so equal reducers of many requests (the
cells of a sweep) share one instance and the tensors it built on the device. A reducer whose
spec names a `position` reads that position's row only. Jobs at one site in one forward with
equal reducers run as one batched call.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch
from ie_core.experiments.sae_math import DictMeta
from ie_core.reduce import Context, Reducer

from ie_vllm.specs import ReducerSpec
from ie_vllm.worker.layout import RequestRows

Lens = Callable[[torch.Tensor], torch.Tensor]

_NO_LENS = "this worker holds no final norm (not the last pipeline stage)"
_LENS: list[Lens] = []

# Dictionaries held by this worker process, by content key: (tensors on the model's device, meta).
DICTIONARIES: dict[str, tuple[dict[str, torch.Tensor], DictMeta]] = {}


def use_lens(lens: Lens) -> None:
    _LENS[:] = [lens]


def put_dictionary(
    key: str, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any], device: Any
) -> None:
    """Keep a dictionary for later requests (idempotent: the key is a content digest)."""
    if key not in DICTIONARIES:
        w = {n: t.to(device=device, dtype=torch.float32) for n, t in tensors.items()}
        DICTIONARIES[key] = (w, DictMeta.from_dict(meta))


def _dictionary(key: str) -> tuple[dict[str, torch.Tensor], DictMeta]:
    got = DICTIONARIES.get(key)
    if got is None:
        raise KeyError(f"dictionary {key!r} was not sent to this worker")
    return got


def context() -> Context:
    return Context(_LENS[0] if _LENS else None, _dictionary, _NO_LENS)


# Reducers by value, bounded: an evicted one is rebuilt (its tensors too) on its next use.
_KEPT_MAX = 256
_KEPT: OrderedDict[Reducer, Reducer] = OrderedDict()


def kept(spec: ReducerSpec) -> ReducerSpec:
    """The spec with the worker's kept instance of its reducer (the first equal one seen)."""
    got = _KEPT.get(spec.reducer)
    if got is None:
        got = _KEPT[spec.reducer] = spec.reducer
        if len(_KEPT) > _KEPT_MAX:
            _KEPT.popitem(last=False)
    else:
        _KEPT.move_to_end(spec.reducer)
    return spec if got is spec.reducer else replace(spec, reducer=got)


def rows_for(
    spec: ReducerSpec, r: RequestRows, site: torch.Tensor
) -> tuple[int, torch.Tensor] | None:
    """The rows of one request a reducer reads in this forward, with the first one's position:
    all of them, or the row at `spec.position` (None when this forward does not hold it)."""
    if spec.position is None:
        return r.first_pos, site[r.start : r.end]
    offset = spec.position - r.first_pos
    if not 0 <= offset < r.n:
        return None
    return spec.position, site[r.start + offset : r.start + offset + 1]


def run(
    jobs: Sequence[tuple[ReducerSpec, tuple[int, torch.Tensor]]],
) -> list[dict[str, torch.Tensor]]:
    """Each job's outputs (in job order), a job being a spec and its rows from their first
    position (as `rows_for` picks them); jobs with equal per-row reducers are concatenated into
    one call, a summarising reducer reads each request's rows alone (one entry per job)."""
    groups: dict[Reducer, list[int]] = {}
    for i, (spec, _) in enumerate(jobs):
        groups.setdefault(spec.reducer, []).append(i)
    results: list[dict[str, torch.Tensor]] = [{} for _ in jobs]
    where = context()
    for reducer, members in groups.items():
        if not reducer.per_row:
            for i in members:
                results[i] = reducer.apply_at(jobs[i][1][1], jobs[i][1][0], where)
            continue
        sizes = [jobs[i][1][1].shape[0] for i in members]
        whole = reducer.apply(torch.cat([jobs[i][1][1] for i in members]), where)
        for name, t in whole.items():
            for i, part in zip(members, torch.split(t, sizes), strict=True):
                results[i][name] = part
    return results


__all__ = ["DICTIONARIES", "context", "kept", "put_dictionary", "rows_for", "run", "use_lens"]
