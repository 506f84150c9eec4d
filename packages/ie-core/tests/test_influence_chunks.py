"""`partial_influence` in bounded chunks of rows (the feature-selection step of a capped graph):
equal to the one-pass sum over the whole normalised row set (bit for bit as one chunk, within
1e-6 relative in chunks), with a negative control, and its peak memory bounded by the chunk
rather than the row set (measured as the resident peak of a fresh process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from ie_core.circuits.influence import chunk_rows, normalized, partial_influence


def _path_sum(a: torch.Tensor, nodes: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The reference: the path sum over a whole normalised row set `a`."""
    total, current = torch.zeros(a.shape[1]), weights.clone()
    while bool(current.any()):
        contrib = current @ a
        total += contrib
        current = torch.where(nodes >= 0, contrib[nodes.clamp_min(0)], torch.zeros_like(current))
    return total


def _known_rows(n_logit: int = 3, n_known: int = 40, n_cols: int = 300) -> tuple[torch.Tensor, ...]:
    """Logit rows, then rows of features 0..n_known-1 (columns 0..n_known-1), each feature reading
    only higher-numbered columns (acyclic), with row scales spread over four decades."""
    g = torch.Generator().manual_seed(7)
    rows = torch.randn(n_logit + n_known, n_cols, generator=g)
    for i in range(n_known):
        rows[n_logit + i, : i + 1] = 0.0
    rows *= 10 ** torch.randint(-2, 2, (n_logit + n_known, 1), generator=g).float()
    nodes = torch.cat([torch.full((n_logit,), -1), torch.arange(n_known)])
    weights = torch.cat([torch.tensor([0.5, 0.3, 0.2]), torch.zeros(n_known)])
    return rows, nodes, weights


def test_chunks_equal_the_one_pass_sum() -> None:
    rows, nodes, weights = _known_rows()
    ref = _path_sum(normalized(rows), nodes, weights)
    assert torch.equal(partial_influence(rows, nodes, weights, len(rows)), ref)
    for chunk in (1, 3, 7, None):
        got = partial_influence(rows, nodes, weights, chunk)
        torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6 * float(ref.abs().max()))
    # Negative control: normalising by a chunk's total instead of each row's is caught.
    wrong = _path_sum(rows.abs() / rows.abs().sum(), nodes, weights)
    assert not torch.allclose(wrong, ref, rtol=1e-3, atol=0)


def test_a_chunk_below_one_row_is_refused() -> None:
    rows, nodes, weights = _known_rows()
    with pytest.raises(ValueError, match="chunk is 0"):
        partial_influence(rows, nodes, weights, 0)
    assert chunk_rows(2**30) == 1 and chunk_rows(1024) == 16 * 1024


_PEAK = """
import json, resource, sys, torch
from ie_core.circuits.influence import partial_influence
torch.set_num_threads(1)
r, w = 64, 500_000  # 128 MB of rows
rows = torch.randn(r, w)
nodes = torch.cat([torch.full((4,), -1), torch.arange(r - 4)])
weights = torch.cat([torch.full((4,), 0.25), torch.zeros(r - 4)])
partial_influence(rows[:, :1000], nodes, weights, 4)  # warm the kernels before measuring
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
partial_influence(rows, nodes, weights, int(sys.argv[1]))
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"extra_bytes": (after - before) * 1024, "rows_bytes": rows.numel() * 4}))
"""


def _extra(chunk: int) -> dict[str, int]:
    # A fixed mmap threshold: freed buffers go back to the system, so the resident peak is the
    # peak of live buffers rather than of the allocator's reuse pattern.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run(
        [sys.executable, "-c", _PEAK, str(chunk)], capture_output=True, text=True, check=True,
        env=env,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_peak_is_bounded_by_the_chunk_not_the_row_set() -> None:
    """One chunk of all 64 rows holds a normalised copy of the row set (128 MB over the rows
    themselves); chunks of 4 rows hold 8 MB at a time."""
    whole, chunked = _extra(64), _extra(4)
    assert whole["extra_bytes"] >= 0.8 * whole["rows_bytes"]
    assert chunked["extra_bytes"] <= 0.25 * whole["rows_bytes"]
    assert whole["extra_bytes"] >= 4 * max(chunked["extra_bytes"], 1)
