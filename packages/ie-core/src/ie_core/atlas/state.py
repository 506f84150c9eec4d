"""A dictionary's per-feature statistics over a corpus, kept as a streaming state that merges.

For every feature: its `k` largest activations with the (sequence, position) of each, its firing
count (activation > 0), the sum of its activations, a fixed-bin histogram of its firing values,
and a few sampled firings per activation band (the quantile samples of a feature page). Pure
torch on whatever device the rows are on, so any backend (or a worker) can run it.

Exact: no sampling of the rows, no approximate top-k. Every selection is by a total order, so
the result does not depend on how the rows were batched, split or merged:
- top-k: value descending, then sequence, then position ascending (ties broken the same way in
  every run);
- band samples: the `samples` firings of smallest `(hash(position), hash(sequence), sequence,
  position)` per (feature, band); the hashes spread the samples over the corpus instead of
  taking its start, and are fixed integer functions, not random draws. The position's hash
  leads so that one window's rows order the same whatever its sequence: a worker that reduces
  one request without knowing its sequence (`ie_core.reduce.atlas_topk`) keeps exactly the
  candidates a corpus-wide selection could take from it.
Counts, histograms and the selections merge bit for bit in any grouping; the sums are fp64 and
agree to fp64 rounding (addition of floats is not associative).

Histogram bins are fixed before any row is seen (so shards agree): `per_octave` bins per power
of two from `2**low` to `2**high`, one bin below (0 < a < 2**low) and one above. A band is one
octave of those bins (under and over are bands of their own).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import torch

__all__ = ["AtlasState", "Binning", "from_rows", "merge", "merge_all", "update"]

_PRIME = 2**31 - 1  # the hash's modulus: products below stay inside int64
_NO_KEY = torch.iinfo(torch.int64).max


@dataclass(frozen=True)
class Binning:
    """Fixed log-spaced histogram bins: `per_octave` per power of two in [2**low, 2**high)."""

    per_octave: int = 4
    low: int = -10
    high: int = 10

    def __post_init__(self) -> None:
        if self.per_octave < 1 or self.high <= self.low:
            raise ValueError(f"binning needs per_octave >= 1 and high > low, got {self}")

    def edges(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """The `bins - 1` edges (fp32): exact powers of two at each octave."""
        steps = torch.arange(self.low * self.per_octave, self.high * self.per_octave + 1)
        return torch.exp2(steps.double() / self.per_octave).float().to(device)

    @property
    def bins(self) -> int:
        return (self.high - self.low) * self.per_octave + 2

    @property
    def bands(self) -> int:
        return self.high - self.low + 2

    def bin_of(self, values: torch.Tensor) -> torch.Tensor:
        """Each (positive) value's bin: 0 below 2**low, `bins - 1` at or above 2**high."""
        return torch.bucketize(values, self.edges(values.device), right=True)

    def band_of(self, bins: torch.Tensor) -> torch.Tensor:
        inner = (bins - 1).div(self.per_octave, rounding_mode="floor") + 1
        return torch.where(bins == 0, 0, torch.where(bins == self.bins - 1, self.bands - 1, inner))

    def to_dict(self) -> dict[str, int]:
        return {"per_octave": self.per_octave, "low": self.low, "high": self.high}


@dataclass(frozen=True, eq=False)
class AtlasState:
    """The running statistics of `d_sae` features. Unfilled slots hold value -inf and
    sequence / position -1 (a feature that fired fewer than `k` times)."""

    k: int
    samples: int
    binning: Binning
    top_values: torch.Tensor  # [d_sae, k] fp32
    top_sequence: torch.Tensor  # [d_sae, k] int64
    top_position: torch.Tensor  # [d_sae, k] int64
    sample_values: torch.Tensor  # [d_sae, bands, samples] fp32
    sample_sequence: torch.Tensor  # [d_sae, bands, samples] int64
    sample_position: torch.Tensor  # [d_sae, bands, samples] int64
    count: torch.Tensor  # [d_sae] int64: rows where the feature fired (> 0)
    total: torch.Tensor  # [d_sae] fp64: sum of its activations
    histogram: torch.Tensor  # [d_sae, bins] int64
    tokens: int  # rows seen

    @property
    def d_sae(self) -> int:
        return int(self.count.shape[0])

    @classmethod
    def empty(
        cls, d_sae: int, k: int, samples: int = 4, binning: Binning | None = None,
        device: torch.device | str = "cpu",
    ) -> AtlasState:  # fmt: skip
        if d_sae < 1 or k < 1 or samples < 0:
            raise ValueError(f"need d_sae >= 1, k >= 1, samples >= 0; got {d_sae}, {k}, {samples}")
        b = binning or Binning()
        top = (d_sae, k)
        band = (d_sae, b.bands, samples)
        return cls(
            k, samples, b,
            _full(top, float("-inf"), torch.float32, device), _full(top, -1, torch.int64, device),
            _full(top, -1, torch.int64, device),
            _full(band, float("-inf"), torch.float32, device),
            _full(band, -1, torch.int64, device), _full(band, -1, torch.int64, device),
            torch.zeros(d_sae, dtype=torch.int64, device=device),
            torch.zeros(d_sae, dtype=torch.float64, device=device),
            torch.zeros(d_sae, b.bins, dtype=torch.int64, device=device), 0,
        )  # fmt: skip

    def tensors(self) -> dict[str, torch.Tensor]:
        """The state as named tensors (for a checkpoint); `from_tensors` reads them back."""
        return {name: getattr(self, name) for name in _TENSORS}

    @classmethod
    def from_tensors(
        cls, tensors: Mapping[str, torch.Tensor], *, k: int, samples: int, binning: Binning,
        tokens: int,
    ) -> AtlasState:  # fmt: skip
        missing = [n for n in _TENSORS if n not in tensors]
        if missing:
            raise ValueError(f"an atlas state needs {missing}; the file is not an atlas state")
        state = cls(k=k, samples=samples, binning=binning, tokens=tokens,
                    **{n: tensors[n] for n in _TENSORS})  # fmt: skip
        _check_shapes(state)
        return state

    def equal(self, other: AtlasState) -> bool:
        """Bit-for-bit equality of every field but the fp64 sums (compare those with a tolerance)."""
        same = (self.k, self.samples, self.binning, self.tokens) == (
            other.k, other.samples, other.binning, other.tokens,
        )  # fmt: skip
        return same and all(
            torch.equal(getattr(self, n), getattr(other, n)) for n in _TENSORS if n != "total"
        )


_TENSORS = (
    "top_values", "top_sequence", "top_position", "sample_values", "sample_sequence",
    "sample_position", "count", "total", "histogram",
)  # fmt: skip


def _full(shape: tuple[int, ...], value: float, dtype: torch.dtype, device: object) -> torch.Tensor:
    return torch.full(shape, value, dtype=dtype, device=device)  # type: ignore[arg-type]


def _check_shapes(s: AtlasState) -> None:
    d, bins = s.d_sae, s.binning
    want = {
        "top_values": (d, s.k), "top_sequence": (d, s.k), "top_position": (d, s.k),
        "sample_values": (d, bins.bands, s.samples), "sample_sequence": (d, bins.bands, s.samples),
        "sample_position": (d, bins.bands, s.samples), "total": (d,), "histogram": (d, bins.bins),
    }  # fmt: skip
    for name, shape in want.items():
        if tuple(getattr(s, name).shape) != shape:
            raise ValueError(f"{name} has shape {tuple(getattr(s, name).shape)}, expected {shape}")


def _hash(value: torch.Tensor) -> torch.Tensor:
    """A fixed integer mix of `value` in [0, 2**31 - 1) (Lehmer steps)."""
    h = value % _PRIME
    for _ in range(3):
        h = (h * 48271 + 11) % _PRIME
    return h


def _select(
    group: torch.Tensor, keys: Sequence[torch.Tensor], payload: Sequence[torch.Tensor],
    groups: int, m: int, fills: Sequence[float],
) -> list[torch.Tensor]:  # fmt: skip
    """Per group, the `m` candidates smallest by `keys` (lexicographic), in that order, as
    `[groups, m]` tensors of each payload (unfilled slots hold `fills`)."""
    order = torch.arange(group.shape[0], device=group.device)
    for key in (*reversed(keys), group):  # stable sorts, least significant key first
        order = order[torch.argsort(key[order], stable=True)]
    ordered = group[order]
    rank = torch.arange(ordered.shape[0], device=group.device) - torch.searchsorted(
        ordered, ordered
    )
    kept = rank < m
    slot = ordered[kept] * m + rank[kept]
    out = []
    for values, fill in zip(payload, fills, strict=True):
        flat = torch.full((groups * m,), fill, dtype=values.dtype, device=values.device)
        flat[slot] = values[order][kept]
        out.append(flat.view(groups, m))
    return out


Slots = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # values, sequences, positions


def _top(
    feature: torch.Tensor, value: torch.Tensor, seq: torch.Tensor, pos: torch.Tensor, d: int, k: int
) -> Slots:
    got = _select(feature, (-value, seq, pos), (value, seq, pos), d, k, (float("-inf"), -1, -1))
    return got[0], got[1], got[2]


def _bands(
    state: AtlasState, feature: torch.Tensor, value: torch.Tensor, seq: torch.Tensor,
    pos: torch.Tensor,
) -> Slots:  # fmt: skip
    b, m, d = state.binning, state.samples, state.d_sae
    band = b.band_of(b.bin_of(value))
    got = _select(
        feature * b.bands + band, (_hash(pos), _hash(seq), seq, pos), (value, seq, pos), d * b.bands,
        m, (float("-inf"), -1, -1),
    )  # fmt: skip
    return got[0].view(d, b.bands, m), got[1].view(d, b.bands, m), got[2].view(d, b.bands, m)


def _entries(
    values: torch.Tensor, seq: torch.Tensor, pos: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A state's filled slots as candidates: (feature, value, sequence, position)."""
    filled = seq >= 0
    feature = torch.arange(values.shape[0], device=values.device).view(
        -1, *([1] * (values.dim() - 1))
    )
    return feature.expand_as(values)[filled], values[filled], seq[filled], pos[filled]


def _check_rows(acts: torch.Tensor, sequence: torch.Tensor, position: torch.Tensor, d: int) -> None:
    if acts.dim() != 2 or acts.shape[1] != d:
        raise ValueError(f"rows must be [n, {d}] feature activations, got {tuple(acts.shape)}")
    n = acts.shape[0]
    if tuple(sequence.shape) != (n,) or tuple(position.shape) != (n,):
        raise ValueError(f"sequence and position must be [{n}], one per row")
    if bool((sequence < 0).any()) or bool((position < 0).any()):
        raise ValueError("sequence and position must be >= 0 (-1 marks an empty slot)")
    if not bool(torch.isfinite(acts).all()):
        raise ValueError("feature activations hold NaN or inf; check the dictionary and rows")


def from_rows(
    state: AtlasState, acts: torch.Tensor, sequence: torch.Tensor, position: torch.Tensor
) -> AtlasState:
    """The statistics of these rows alone (same k, samples and bins as `state`)."""
    d = state.d_sae
    _check_rows(acts, sequence, position, d)
    acts = acts.float()
    sequence, position = sequence.to(acts.device), position.to(acts.device)
    fired = acts > 0
    row, feature = fired.nonzero(as_tuple=True)
    value = acts[row, feature]
    bins = state.binning.bin_of(value)
    histogram = torch.bincount(
        feature * state.binning.bins + bins, minlength=d * state.binning.bins
    )
    # Only the rows at or above a feature's k-th largest value can enter its top-k (ties kept).
    kth = torch.topk(acts, min(state.k, acts.shape[0]), dim=0).values[-1]
    near = value >= kth[feature]
    top = _top(feature[near], value[near], sequence[row][near], position[row][near], d, state.k)
    bands = _bands(state, feature, value, sequence[row], position[row])
    return AtlasState(
        state.k, state.samples, state.binning, top[0], top[1], top[2], bands[0], bands[1],
        bands[2], fired.sum(0), acts.double().sum(0), histogram.view(d, -1), int(acts.shape[0]),
    )  # fmt: skip


def merge(a: AtlasState, b: AtlasState) -> AtlasState:
    """The statistics of the rows of `a` and of `b` (disjoint: no (sequence, position) in both)."""
    return merge_all([a, b])


def merge_all(states: Sequence[AtlasState]) -> AtlasState:
    """The statistics of the rows of every state (disjoint), in one selection (a batch of
    windows' partials merges as cheaply as two states)."""
    a = states[0]
    for b in states[1:]:
        if (a.d_sae, a.k, a.samples, a.binning) != (b.d_sae, b.k, b.samples, b.binning):
            raise ValueError(
                f"cannot merge states of different shapes: d_sae/k/samples/bins {a.d_sae}/{a.k}/"
                f"{a.samples}/{a.binning} and {b.d_sae}/{b.k}/{b.samples}/{b.binning}"
            )
    top = [torch.cat(p) for p in zip(
        *(_entries(s.top_values, s.top_sequence, s.top_position) for s in states), strict=True
    )]  # fmt: skip
    band = [torch.cat(p) for p in zip(
        *(_entries(s.sample_values, s.sample_sequence, s.sample_position) for s in states),
        strict=True,
    )]  # fmt: skip
    tops = _top(top[0], top[1], top[2], top[3], a.d_sae, a.k)
    # A band sample's band is recomputed from its value: a candidate carries only its feature.
    bands = _bands(a, band[0], band[1], band[2], band[3])
    count, total, histogram, tokens = a.count, a.total, a.histogram, a.tokens
    for b in states[1:]:  # in order: the fp64 sums add as a chain of merges would
        count, total = count + b.count, total + b.total
        histogram, tokens = histogram + b.histogram, tokens + b.tokens
    return replace(
        a, top_values=tops[0], top_sequence=tops[1], top_position=tops[2],
        sample_values=bands[0], sample_sequence=bands[1], sample_position=bands[2],
        count=count, total=total, histogram=histogram, tokens=tokens,
    )  # fmt: skip


def update(
    state: AtlasState, acts: torch.Tensor, sequence: torch.Tensor, position: torch.Tensor
) -> AtlasState:
    """`state` after the rows `acts` `[n, d_sae]` at (sequence, position) `[n]` each."""
    return merge(state, from_rows(state, acts, sequence, position))
