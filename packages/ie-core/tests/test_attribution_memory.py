"""Attribution's memory-bounded steps equal their plain computations. `partial_influence` in
bounded chunks of rows (the feature-selection step of a capped graph): the one-pass sum over the
whole normalised row set (bit for bit as one chunk, within 1e-6 relative in chunks), with a
negative control, its peak memory bounded by the chunk rather than the row set (the resident
peak of a fresh process, from a reset high-water mark). `prune` with its buffers reused: bit for
bit the plain computation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
import torch
from ie_core.circuits import Graph, LogitTarget, prune
from ie_core.circuits.influence import chunk_rows, normalized, partial_influence, path_influence


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
import json, sys, torch
from pathlib import Path
from ie_core.circuits.influence import partial_influence

def kib(field):
    lines = Path("/proc/self/status").read_text().splitlines()
    return int(next(x for x in lines if x.startswith(field)).split()[1])

torch.set_num_threads(1)
r, w = 64, 500_000  # 128 MB of rows
rows = torch.randn(r, w)
nodes = torch.cat([torch.full((4,), -1), torch.arange(r - 4)])
weights = torch.cat([torch.full((4,), 0.25), torch.zeros(r - 4)])
partial_influence(rows[:, :1000], nodes, weights, 4)  # warm the kernels before measuring
Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) restarts from here
before = kib("VmRSS:")
partial_influence(rows, nodes, weights, int(sys.argv[1]))
print(json.dumps({"extra_bytes": (kib("VmHWM:") - before) * 1024, "rows_bytes": rows.numel() * 4}))
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


def _reference_prune(g: Graph, node_threshold: float, edge_threshold: float) -> tuple[Any, ...]:
    """Pruning written plainly, every intermediate its own tensor and `torch.sort`'s cut."""

    def cut(scores: torch.Tensor, keep: float) -> torch.Tensor:
        ordered = torch.sort(scores.flatten(), descending=True).values
        share = torch.cumsum(ordered, 0) / ordered.sum().clamp_min(1e-30)
        at = int(torch.searchsorted(share, torch.tensor(keep, dtype=share.dtype)))
        return ordered[min(at, len(ordered) - 1)]

    adj, n, fixed = g.adjacency, g.n_nodes, g.token_offset
    logit_w = torch.zeros(n)
    logit_w[g.logit_offset :] = g.logit_probabilities
    influence = path_influence(normalized(adj), logit_w)
    nodes = influence >= cut(influence, node_threshold)
    nodes[fixed:] = True
    a = normalized(adj * nodes[:, None] * nodes[None, :])
    scores = a * (path_influence(a, logit_w) + logit_w)[:, None]
    edges = scores >= cut(scores, edge_threshold)
    while True:
        edges &= nodes[:, None] & nodes[None, :]
        before = nodes.clone()
        nodes[:fixed] &= edges[:, :fixed].any(0)
        nodes[: g.n_features] &= edges[: g.n_features].any(1)
        if torch.equal(nodes, before):
            return nodes, edges


def _random_graph(n_feat: int = 60, n_logit: int = 3) -> Graph:
    """Features read later features, the error and the token; logits read all of those."""
    g = torch.Generator().manual_seed(3)
    n = n_feat + 2 + n_logit
    adj = torch.randn(n, n, generator=g) * (torch.rand(n, n, generator=g) < 0.3)
    adj[: n_feat + 2] = torch.triu(adj[: n_feat + 2], 1)
    adj[:, n_feat + 2 :] = 0.0
    adj[n_feat : n_feat + 2] = 0.0  # the error and token read nothing
    return Graph(
        prompt="x", tokens=(5,), token_strings=("x",), n_layers=1,
        active_features=torch.tensor([[0, 0, i] for i in range(n_feat)]),
        activation_values=torch.ones(n_feat), selected_features=torch.arange(n_feat),
        logit_targets=tuple(LogitTarget(i, str(i), p) for i, p in enumerate([0.6, 0.3, 0.1])),
        adjacency=adj, node_inputs=torch.zeros(n), node_bias=torch.zeros(n),
    )  # fmt: skip


def test_pruning_in_place_equals_the_plain_computation() -> None:
    g = _random_graph()
    for node_t, edge_t in ((0.8, 0.98), (0.5, 0.9), (1.0, 1.0)):
        got = prune(g, node_t, edge_t)
        nodes, edges = _reference_prune(g, node_t, edge_t)
        assert torch.equal(got.node_mask, nodes) and torch.equal(got.edge_mask, edges)
        assert 0 < int(nodes[: g.n_features].sum()) < g.n_features or node_t == 1.0
    # Negative control: a looser node threshold keeps a different set on this graph.
    assert not torch.equal(prune(g, 0.5, 0.98).node_mask, prune(g, 0.8, 0.98).node_mask)
