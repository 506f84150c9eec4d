"""The atlas reducer (`AtlasTopK`) against the dense fold: one request's rows reduced in chunks
(as a worker sees a chunked prefill), joined, and merged per window give the state that
folding the dense feature activations gives (`ie_core.atlas.state.update`), bit for bit but the
fp64 sums (1e-12 relative); a reducer that drops the last chunk's rows does not."""

from __future__ import annotations

import itertools

import pytest
import torch
from ie_core.atlas.partial import partial_state
from ie_core.atlas.state import AtlasState, Binning, merge, merge_all, update
from ie_core.experiments.sae_math import encode
from ie_core.experiments.saes import from_tensors
from ie_core.reduce import AtlasTopK, Context, Reduction, pad_cat, per_prompt, reduce_cache
from ie_core.reduce.kinds import reducer_from_dict

WIDTH, D, K, SAMPLES, SEQ = 16, 40, 4, 3, 30
BINS = Binning(4, -6, 4)


def _sae():
    g = torch.Generator().manual_seed(0)
    w = {"W_enc": torch.randn(WIDTH, D, generator=g) / WIDTH**0.5,
         "b_enc": torch.randn(D, generator=g) * 0.3 - 0.4,
         "W_dec": torch.randn(D, WIDTH, generator=g), "b_dec": torch.zeros(WIDTH)}  # fmt: skip
    return from_tensors(w, address="resid_post.1")


def _windows(n: int = 5) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    rows = torch.randn(n, SEQ, WIDTH, generator=g)
    if n > 2:
        rows[2, 10:20] = rows[0, 10:20]  # equal rows in two windows: ties across sequences
    return rows


def _reducer(sae, skip: int = 1) -> AtlasTopK:
    return AtlasTopK(sae.key, K, SAMPLES, (BINS.per_octave, BINS.low, BINS.high), skip, sae)


def _dense(sae, rows: torch.Tensor, skip: int, cuts: list[int]) -> AtlasState:
    """The reference: every window's dense activations folded one window at a time. Each chunk
    is encoded alone, as the reducer encodes it (a matmul of another height may round the last
    bit otherwise), so both folds read the same activations."""
    state = AtlasState.empty(D, K, SAMPLES, BINS)
    for i, window in enumerate(rows):
        bounds = sorted({skip, *(c for c in cuts if c > skip), SEQ})
        acts = torch.cat([encode(window[a:b], sae.weights, sae.meta)
                          for a, b in itertools.pairwise(bounds)])  # fmt: skip
        pos = torch.arange(skip, SEQ)
        state = update(state, acts, torch.full_like(pos, i), pos)
    return state


def _reduced(reducer: AtlasTopK, rows: torch.Tensor, cuts: list[int], drop_last=False):
    """Each window reduced in chunks split at `cuts`, as a worker would, joined per window."""
    state = AtlasState.empty(D, K, SAMPLES, BINS)
    for i, window in enumerate(rows):
        bounds = [0, *cuts, SEQ]
        chunks = [
            reducer.apply_at(window[a:b], a, Context()) for a, b in itertools.pairwise(bounds)
        ]
        if drop_last:
            chunks = chunks[:-1]
        stacked = {n: pad_cat([c[n] for c in chunks]) for n in chunks[0]}
        joined = reducer.join(stacked)
        state = merge(state, partial_state(joined, 0, K, SAMPLES, BINS, sequence=i))
    return state


@pytest.mark.parametrize("cuts", [[], [1], [7, 19], [1, 2, 29]])
def test_chunked_reduction_equals_the_dense_fold(cuts: list[int]) -> None:
    sae = _sae()
    rows = _windows()
    want = _dense(sae, rows, 1, cuts)
    got = _reduced(_reducer(sae), rows, cuts)
    assert want.count.sum() > 100 and (want.top_sequence >= 0).all()
    assert got.equal(want)
    torch.testing.assert_close(got.total, want.total, rtol=1e-12, atol=0)


def test_the_bos_rows_are_not_read() -> None:
    sae = _sae()
    rows = _windows()
    got = _reduced(_reducer(sae, skip=3), rows, [2, 11])
    assert got.equal(_dense(sae, rows, 3, [2, 11])) and got.tokens == 5 * (SEQ - 3)
    assert not got.equal(_dense(sae, rows, 0, [2, 11]))


def test_negative_control_dropping_the_last_chunk_differs() -> None:
    sae = _sae()
    rows = _windows()
    got = _reduced(_reducer(sae), rows, [25], drop_last=True)
    assert not got.equal(_dense(sae, rows, 1, [25]))
    assert _reduced(_reducer(sae), rows, [25]).equal(_dense(sae, rows, 1, [25]))
    assert got.tokens == 5 * 24  # what the atlas checks against the window's length


def test_host_fallback_and_per_prompt_join_equal_the_reference() -> None:
    """`reduce_cache` (eager, the host fallback) and `per_prompt` (a worker's chunk entries,
    per request) give each window's partial."""
    sae = _sae()
    rows = _windows(3)
    red = Reduction(sae.address, _reducer(sae, skip=0), "atlas")
    host = reduce_cache({sae.address: rows}, [red], Context())["atlas"]
    results = []
    for window in rows:
        a, b = red.reducer.apply_at(window[:9], 0, Context()), red.reducer.apply_at(
            window[9:], 9, Context()
        )  # fmt: skip
        results.append({f"atlas|{n}": pad_cat([a[n], b[n]]) for n in a})
    worker = per_prompt([red], results)["atlas"]
    for i in range(3):
        one = partial_state(host, i, K, SAMPLES, BINS, sequence=i)
        two = partial_state(worker, i, K, SAMPLES, BINS, sequence=i)
        assert one.tokens == two.tokens == SEQ
        if i == 0:  # window 0 is sequence 0 in the reference as well
            assert one.equal(_dense(sae, rows[:1], 0, []))
            assert two.equal(_dense(sae, rows[:1], 0, [9]))


def test_wire_form_round_trips_and_is_checked() -> None:
    reducer = _reducer(_sae())
    back = reducer_from_dict(reducer.to_wire())
    assert back == reducer and hash(back) == hash(reducer) and back.sae is None
    assert not reducer.portable() and back.portable()
    with pytest.raises(ValueError, match="k >= 1"):
        AtlasTopK("key", 0)
    with pytest.raises(ValueError, match="ints"):
        reducer_from_dict({"kind": "atlas_topk", "dictionary": "k", "k": 2, "binning": [1, 2]})


def test_entries_are_sparse_and_padded_entries_read_back() -> None:
    """What crosses per window: one entry of records, fewer where fewer features fire, never
    more than `row_bytes`; entries of different sizes padded together (`pad_cat`, as a worker
    joins a request's chunks) read back to the same states."""
    sae = _sae()
    reducer = _reducer(sae, skip=0)
    rows = _windows(2)
    rows[1] *= 0.05  # small rows: fewer features fire, fewer records
    one, two = (reducer.apply_at(w, 0, Context()) for w in rows)
    sent = [sum(t.nbytes for t in e.values()) for e in (one, two)]
    assert sent[1] < sent[0] <= reducer.row_bytes(WIDTH)
    assert all(t.shape[0] == 1 for t in one.values())
    both = {n: pad_cat([one[n], two[n]]) for n in one}
    assert both["top_index"].shape[1] == one["top_index"].shape[1] > two["top_index"].shape[1]
    for i, entry in enumerate((one, two)):
        alone = partial_state(entry, 0, K, SAMPLES, BINS, sequence=i)
        padded = partial_state(both, i, K, SAMPLES, BINS, sequence=i)
        assert alone.equal(padded) and torch.equal(alone.total, padded.total)
        at_zero = partial_state(entry, 0, K, SAMPLES, BINS)  # the reference's window is 0
        assert at_zero.equal(_dense(sae, rows[i : i + 1], 0, []))


def test_merging_a_batch_at_once_equals_a_chain_of_merges() -> None:
    """`merge_all` (how the atlas merges a batch's partials) equals merging one at a time,
    the fp64 sums included (they add in the same order)."""
    sae = _sae()
    rows = _windows()
    reducer = _reducer(sae)
    parts = [
        partial_state(reducer.apply_at(w, 0, Context()), 0, K, SAMPLES, BINS, sequence=i)
        for i, w in enumerate(rows)
    ]
    chained = parts[0]
    for p in parts[1:]:
        chained = merge(chained, p)
    at_once = merge_all(parts)
    assert at_once.equal(chained) and torch.equal(at_once.total, chained.total)
    assert not merge_all(parts[:-1]).equal(chained)
