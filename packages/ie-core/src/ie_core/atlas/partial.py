"""One request's atlas statistics as a reducer ships them: an `AtlasState` of that request's
rows alone, without its sequence (a worker does not know it), as sparse named tensors with one
leading entry per forward chunk; and back, with the sequence the host knows.

Sparse, so what crosses grows with the firings, not with the dictionary's width: each filled
top-k slot, band-sample slot, non-empty histogram bin and fired feature's sum is one record (its
flat index in the state's tensor, and its value). Entries of different requests or chunks hold
different numbers of records: `sizes` says how many, and the rest is padding
(`ie_core.reduce.host.pad_cat`).

A request's rows may reach the worker in several forwards (chunked prefill): each chunk's
partial is its own entry, and `join` merges a request's entries into one. Positions are the
request's own, so the selections of `ie_core.atlas.state` (ordered by position, then sequence)
are the same as a corpus-wide pass would make from these rows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import reduce

import torch

from ie_core.atlas.state import AtlasState, Binning, from_rows, merge

__all__ = ["chunk_outputs", "join", "partial_state"]

# sizes: rows read, d_sae, then the records of each part below.
_PARTS = ("top", "sample", "bin", "fired")


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
    # int32 indices and positions: a state's tensors and a request stay far below 2**31.
    top = (state.top_position >= 0).flatten().nonzero().squeeze(1)
    sample = (state.sample_position >= 0).flatten().nonzero().squeeze(1)
    cell = state.histogram.flatten().nonzero().squeeze(1)
    fired = state.count.nonzero().squeeze(1)
    out = {
        "top_index": top.int(),
        "top_value": state.top_values.flatten()[top],
        "top_position": state.top_position.flatten()[top].int(),
        "sample_index": sample.int(),
        "sample_value": state.sample_values.flatten()[sample],
        "sample_position": state.sample_position.flatten()[sample].int(),
        "bin_index": cell.int(),
        "bin_count": state.histogram.flatten()[cell].int(),
        "fired_index": fired.int(),
        "fired_total": state.total[fired],
    }
    counts = [rows, state.d_sae, len(top), len(sample), len(cell), len(fired)]
    out = {name: t[None] for name, t in out.items()}
    out["sizes"] = torch.tensor([counts], dtype=torch.int64, device=state.count.device)
    return out


def partial_state(
    outputs: Mapping[str, torch.Tensor], entry: int, k: int, samples: int, binning: Binning,
    sequence: int = 0,
) -> AtlasState:  # fmt: skip
    """Entry `entry` of `outputs` as the state of those rows, at `sequence`."""
    sizes = [int(v) for v in outputs["sizes"][entry]]
    rows, d = sizes[0], sizes[1]
    used: dict[str, int] = dict(zip(_PARTS, sizes[2:], strict=True))

    def part(name: str) -> torch.Tensor:
        return outputs[name][entry, : used[name.split("_")[0]]].cpu()

    state = AtlasState.empty(d, k, samples, binning)
    top_values, top_position = _filled(state.top_values, state.top_position, part, "top")
    sample_values, sample_position = _filled(
        state.sample_values, state.sample_position, part, "sample"
    )
    histogram = state.histogram.flatten().index_put((part("bin_index").long(),),
                                                    part("bin_count").long())  # fmt: skip
    histogram = histogram.view(d, binning.bins)
    total = state.total.index_put((part("fired_index").long(),), part("fired_total").double())
    return AtlasState(
        k, samples, binning, top_values, _at(top_position, sequence), top_position,
        sample_values, _at(sample_position, sequence), sample_position, histogram.sum(1),
        total, histogram, rows,
    )  # fmt: skip


def _filled(
    values: torch.Tensor, positions: torch.Tensor, part: Callable[[str], torch.Tensor], name: str
) -> tuple[torch.Tensor, torch.Tensor]:
    index = (part(f"{name}_index").long(),)
    got_values = values.flatten().index_put(index, part(f"{name}_value").float())
    got_positions = positions.flatten().index_put(index, part(f"{name}_position").long())
    return got_values.view_as(values), got_positions.view_as(positions)


def _at(position: torch.Tensor, sequence: int) -> torch.Tensor:
    return torch.where(position >= 0, sequence, -1)


def join(
    outputs: Mapping[str, torch.Tensor], k: int, samples: int, binning: Binning
) -> dict[str, torch.Tensor]:
    """One request's chunk entries `[m, ...]` merged into one entry `[1, ...]`."""
    m = int(outputs["sizes"].shape[0])
    if m == 1:
        return {name: t.cpu() for name, t in outputs.items()}
    states = [partial_state(outputs, i, k, samples, binning) for i in range(m)]
    return _outputs(reduce(merge, states), sum(s.tokens for s in states))
