"""Reductions on the host: the one fallback for rows a backend captured instead of reducing in
place (`reduce_cache`), and the results' flat form `label|output` as workers and HTTP carry them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ie_core.reduce.base import Context, Reduction

if TYPE_CHECKING:
    from torch import Tensor

Reduced = dict[str, dict[str, "Tensor"]]


def check_reductions(
    reductions: Sequence[Reduction], width_of: Callable[[str], int], vocab: int
) -> None:
    """Each reduction's reducer against its point's width and the vocabulary, before any
    forward."""
    for r in reductions:
        r.reducer.check(width_of(r.address), r.address, vocab)


def reduce_cache(
    cache: Mapping[Any, Tensor], reductions: Sequence[Reduction], context: Context
) -> Reduced:
    """Each reduction over captured rows `[batch, seq, width]` (its `last` row only where asked):
    `[batch, seq, ...]` or `[batch, ...]` per output."""
    out: Reduced = {}
    for r in reductions:
        rows = cache[r.address]
        if not r.reducer.per_row:
            out[r.label] = _summaries(r, rows, context)
            continue
        if r.last:
            rows = rows[:, -1]
        got = r.reducer.apply(rows.reshape(-1, rows.shape[-1]), context)
        out[r.label] = {n: t.reshape(*rows.shape[:-1], *t.shape[1:]) for n, t in got.items()}
    return out


def _summaries(r: Reduction, rows: Tensor, context: Context) -> dict[str, Tensor]:
    """A summarising reducer over each prompt's rows `[seq, width]`: one entry per prompt."""

    parts = [r.reducer.apply_at(rows[b], 0, context) for b in range(rows.shape[0])]
    return {n: pad_cat([p[n] for p in parts]) for n in (parts[0] if parts else {})}


def pad_cat(parts: Sequence[Tensor]) -> Tensor:
    """A summarising reducer's entries (one leading entry each, of sizes that may differ: a
    sparse result) concatenated, the smaller padded with zeros to the largest; the entries say
    themselves what is real."""
    import torch  # the parts are tensors already: this imports nothing new

    if len({tuple(p.shape[1:]) for p in parts}) <= 1:
        return torch.cat(list(parts))
    widest = [max(p.shape[i] for p in parts) for i in range(1, parts[0].dim())]
    grown = []
    for p in parts:
        pad = [x for i in reversed(range(1, p.dim())) for x in (0, widest[i - 1] - p.shape[i])]
        grown.append(torch.nn.functional.pad(p, pad))
    return torch.cat(grown)


def flat(reduced: Mapping[str, Mapping[str, Tensor]]) -> dict[str, Tensor]:
    """`label|output` -> tensor (the names a worker stores and `ie serve` answers with)."""
    return {f"{label}|{name}": t for label, got in reduced.items() for name, t in got.items()}


def nested(tensors: Mapping[str, Tensor], reductions: Sequence[Reduction]) -> Reduced:
    """The reductions' outputs from flat names (other names, captured rows, are left out)."""
    out: Reduced = {}
    for r in reductions:
        prefix = f"{r.label}|"
        got = {n[len(prefix) :]: t for n, t in tensors.items() if n.startswith(prefix)}
        if not got:
            raise RuntimeError(f"no outputs came back for reduction {r.label!r}")
        out[r.label] = got
    return out


def per_prompt(reductions: Sequence[Reduction], results: Sequence[Mapping[str, Tensor]]) -> Reduced:
    """One result per prompt (flat names, `[rows, ...]` each) as the batch: stacked
    (`[batch, seq, ...]`) or, for a reduction of the last row, concatenated (`[batch, ...]`);
    a summarising reducer's entries joined per prompt (`[batch, ...]`)."""
    import torch  # the results are tensors already: this imports nothing new

    parts = [nested(r, reductions) for r in results]
    out: Reduced = {}
    for r in reductions:
        if not r.reducer.per_row:  # each prompt's entries (one per forward chunk) as one
            parts_of = [r.reducer.join(p[r.label]) for p in parts]
            names = parts_of[0] if parts_of else {}
            out[r.label] = {n: pad_cat([p[n].cpu() for p in parts_of]) for n in names}
            continue
        join = torch.cat if r.last else torch.stack
        names = parts[0][r.label] if parts else {}
        out[r.label] = {n: join([p[r.label][n].cpu() for p in parts]) for n in names}
    return out


__all__ = [
    "Reduced", "check_reductions", "flat", "nested", "pad_cat", "per_prompt", "reduce_cache",
]  # fmt: skip
