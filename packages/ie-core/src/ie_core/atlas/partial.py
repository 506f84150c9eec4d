"""One request's atlas statistics as a reducer ships them: an `AtlasState` of that request's
rows alone, without its sequence (a worker does not know it), as named tensors with one leading
entry per forward chunk; and back, with the sequence the host knows.

A request's rows may reach the worker in several forwards (chunked prefill): each chunk's
partial is its own entry, and `join` merges a request's entries into one. Positions are the
request's own, so the selections of `ie_core.atlas.state` (ordered by position, then sequence)
are the same as a corpus-wide pass would make from these rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import reduce

import torch

from ie_core.atlas.state import AtlasState, Binning, from_rows, merge

__all__ = ["chunk_outputs", "join", "partial_state"]


def chunk_outputs(
    acts: torch.Tensor, first: int, k: int, samples: int, binning: Binning
) -> dict[str, torch.Tensor]:
    """The statistics of feature activations `acts` `[n, d_sae]` at positions `first`,
    `first + 1`, ...: each output with one leading entry."""
    empty = AtlasState.empty(int(acts.shape[1]), k, samples, binning, acts.device)
    n = int(acts.shape[0])
    if n == 0:
        return _outputs(empty, 0)
    position = torch.arange(first, first + n, device=acts.device)
    return _outputs(from_rows(empty, acts, torch.zeros_like(position), position), n)


def _outputs(state: AtlasState, rows: int) -> dict[str, torch.Tensor]:
    # Positions fit int32 (a request is far shorter than 2**31 tokens): half the bytes of int64.
    return {
        "top_values": state.top_values[None],
        "top_position": state.top_position.int()[None],
        "sample_values": state.sample_values[None],
        "sample_position": state.sample_position.int()[None],
        "count": state.count.int()[None],
        "total": state.total[None],
        "histogram": state.histogram.int()[None],
        "rows": torch.tensor([rows], dtype=torch.int64, device=state.count.device),
    }


def partial_state(
    outputs: Mapping[str, torch.Tensor], entry: int, k: int, samples: int, binning: Binning,
    sequence: int = 0,
) -> AtlasState:  # fmt: skip
    """Entry `entry` of `outputs` as the state of those rows, at `sequence`."""
    o = {name: t[entry].cpu() for name, t in outputs.items()}
    top_position, sample_position = o["top_position"].long(), o["sample_position"].long()
    return AtlasState(
        k, samples, binning, o["top_values"], _at(top_position, sequence), top_position,
        o["sample_values"], _at(sample_position, sequence), sample_position,
        o["count"].long(), o["total"], o["histogram"].long(), int(o["rows"]),
    )  # fmt: skip


def _at(position: torch.Tensor, sequence: int) -> torch.Tensor:
    return torch.where(position >= 0, sequence, -1)


def join(
    outputs: Mapping[str, torch.Tensor], k: int, samples: int, binning: Binning
) -> dict[str, torch.Tensor]:
    """One request's chunk entries `[m, ...]` merged into one entry `[1, ...]`."""
    m = int(outputs["rows"].shape[0])
    if m == 1:
        return {name: t.cpu() for name, t in outputs.items()}
    states = [partial_state(outputs, i, k, samples, binning) for i in range(m)]
    return _outputs(reduce(merge, states), sum(s.tokens for s in states))
