"""The atlas's streaming state against a brute force over all rows at once (torch.topk and plain
Python sorting, written here independently), its tie order, and merges against one pass."""

from __future__ import annotations

import math

import pytest
import torch
from ie_core.atlas.state import AtlasState, Binning, from_rows, merge, update

D, K, SAMPLES = 24, 5, 2


def _rows(seed: int, n: int = 300) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sparse non-negative rows in windows of 20 positions, with exact repeats (ties)."""
    g = torch.Generator().manual_seed(seed)
    acts = torch.relu(torch.randn(n, D, generator=g) * 2 - 1.5)
    if n >= 60:
        acts[40:60] = acts[0:20]  # window 2 repeats window 0: equal values at other sequences
    acts[:, 3] = torch.where(acts[:, 3] > 0, 1.0, 0.0)  # feature 3: many ties at one value
    acts[:, 7] = 0.0  # feature 7 never fires
    acts[5, 7] = 0.25  # ... but once
    seq = torch.arange(n) // 20
    pos = torch.arange(n) % 20
    return acts, seq, pos


def _steps(acts: torch.Tensor, seq: torch.Tensor, pos: torch.Tensor, size: int):
    for i in range(0, acts.shape[0], size):
        yield acts[i : i + size], seq[i : i + size], pos[i : i + size]


def _one_pass(acts, seq, pos, size: int = 40, drop_last: bool = False) -> AtlasState:
    state = AtlasState.empty(D, K, SAMPLES)
    steps = list(_steps(acts, seq, pos, size))
    for step in steps[:-1] if drop_last else steps:
        state = update(state, *step)
    return state


def _reference_top(acts, seq, pos, feature: int) -> list[tuple[float, int, int]]:
    column = acts[:, feature]
    entries = [(float(column[i]), int(seq[i]), int(pos[i])) for i in range(len(column))]
    fired = [e for e in entries if e[0] > 0]
    return sorted(fired, key=lambda e: (-e[0], e[1], e[2]))[:K]


def _state_top(state: AtlasState, feature: int) -> list[tuple[float, int, int]]:
    got = zip(
        state.top_values[feature].tolist(),
        state.top_sequence[feature].tolist(),
        state.top_position[feature].tolist(),
        strict=True,
    )
    return [(v, s, p) for v, s, p in got if s >= 0]


def test_top_k_counts_sums_and_histogram_equal_brute_force() -> None:
    acts, seq, pos = _rows(0)
    state = _one_pass(acts, seq, pos)
    assert state.tokens == acts.shape[0]
    values, _ = torch.topk(acts, K, dim=0)  # all rows at once: [K, D]
    for f in range(D):
        want = _reference_top(acts, seq, pos, f)
        assert _state_top(state, f) == want
        fired = values[:, f][values[:, f] > 0]
        assert torch.equal(state.top_values[f][: len(fired)], fired)
    assert torch.equal(state.count, (acts > 0).sum(0))
    assert torch.allclose(state.total, acts.double().sum(0), rtol=1e-12, atol=0)
    # Histogram: log2 bins counted by hand, per row.
    b = Binning()
    for f in (0, 3, 7, 11):
        want = [0] * b.bins
        for v in acts[:, f].tolist():
            if v > 0:
                e = math.log2(v)
                inner = math.floor((e - b.low) * b.per_octave) + 1
                want[0 if e < b.low else min(inner, b.bins - 1)] += 1
        assert state.histogram[f].tolist() == want
    assert state.count[7] == 1 and _state_top(state, 7) == [(0.25, 0, 5)]


def test_ties_are_broken_by_sequence_then_position() -> None:
    acts, seq, pos = _rows(0)
    state = _one_pass(acts, seq, pos)
    top = _state_top(state, 3)  # every firing of feature 3 is exactly 1.0
    first = sorted((int(seq[i]), int(pos[i])) for i in range(len(seq)) if acts[i, 3] > 0)
    assert [(s, p) for _, s, p in top] == first[:K]
    # The same rows in another step order (reversed, other sizes) give the same state.
    backwards = AtlasState.empty(D, K, SAMPLES)
    for step in reversed(list(_steps(acts, seq, pos, 33))):
        backwards = update(backwards, *step)
    assert backwards.equal(state)


def test_band_samples_are_firings_of_their_band() -> None:
    acts, seq, pos = _rows(1)
    state = _one_pass(acts, seq, pos)
    b = state.binning
    for f in range(D):
        for band in range(b.bands):
            for v, s, p in zip(
                state.sample_values[f, band].tolist(),
                state.sample_sequence[f, band].tolist(),
                state.sample_position[f, band].tolist(),
                strict=True,
            ):
                if s < 0:
                    continue
                row = s * 20 + p
                assert acts[row, f].item() == v > 0
                assert int(b.band_of(b.bin_of(torch.tensor([v])))[0]) == band
    # A band with firings has min(samples, firings) samples.
    bands = b.band_of(b.bin_of(acts[:, 0][acts[:, 0] > 0]))
    for band in range(b.bands):
        assert int((state.sample_sequence[0, band] >= 0).sum()) == min(
            SAMPLES, int((bands == band).sum())
        )


@pytest.mark.parametrize("split", [40, 120, 260])
def test_merge_of_two_shards_equals_one_pass(split: int) -> None:
    acts, seq, pos = _rows(2)
    whole = _one_pass(acts, seq, pos)
    a = _one_pass(acts[:split], seq[:split], pos[:split])
    b = _one_pass(acts[split:], seq[split:], pos[split:])
    for merged in (merge(a, b), merge(b, a)):
        assert merged.equal(whole)
        assert torch.allclose(merged.total, whole.total, rtol=1e-12, atol=0)


def test_merge_is_associative_over_interleaved_shards() -> None:
    acts, seq, pos = _rows(3)
    parts = [_one_pass(acts[i::3], seq[i::3], pos[i::3], size=17) for i in range(3)]
    left = merge(merge(parts[0], parts[1]), parts[2])
    right = merge(parts[0], merge(parts[2], parts[1]))
    assert left.equal(right) and left.equal(_one_pass(acts, seq, pos))


def test_negative_control_dropping_the_last_step_is_caught() -> None:
    acts, seq, pos = _rows(4)
    whole = _one_pass(acts, seq, pos)
    short = _one_pass(acts, seq, pos, drop_last=True)
    assert not short.equal(whole)
    assert any(_state_top(short, f) != _reference_top(acts, seq, pos, f) for f in range(D))
    assert not torch.equal(short.count, (acts > 0).sum(0))


def test_refusals() -> None:
    state = AtlasState.empty(D, K, SAMPLES)
    acts, seq, pos = _rows(0, 20)
    bad = acts.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        from_rows(state, bad, seq, pos)
    with pytest.raises(ValueError, match=r"\[n, 24\]"):
        from_rows(state, acts[:, :5], seq, pos)
    with pytest.raises(ValueError, match="different shapes"):
        merge(state, AtlasState.empty(D, K + 1, SAMPLES))


def test_round_trip_through_tensors() -> None:
    acts, seq, pos = _rows(5)
    state = _one_pass(acts, seq, pos)
    back = AtlasState.from_tensors(
        state.tensors(), k=K, samples=SAMPLES, binning=state.binning, tokens=state.tokens
    )
    assert back.equal(state) and torch.equal(back.total, state.total)
