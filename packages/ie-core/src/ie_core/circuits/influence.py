"""Influence on the logits through a graph's edges (Ameisen et al. 2025, "Circuit Tracing",
pruning section): edge weights are made non-negative and each target's incoming weights sum to
1, and a node's influence is the logit-probability-weighted sum over all paths from it to the
logits, `w @ (A + A^2 + ...)`. The graph is acyclic, so the series ends after at most
n_layers + 2 terms."""

from __future__ import annotations

import torch


def normalized_(adjacency: torch.Tensor) -> torch.Tensor:
    """`normalized`, in place: no second adjacency-sized buffer."""
    a = adjacency.abs_()
    return a.div_(a.sum(1, keepdim=True).clamp_min(1e-10))


def normalized(adjacency: torch.Tensor) -> torch.Tensor:
    """|A| with each row scaled to sum to 1 (rows of zeros stay zero)."""
    return normalized_(adjacency.abs())


def path_influence(
    a_norm: torch.Tensor, weights: torch.Tensor, max_terms: int = 1000
) -> torch.Tensor:
    """`weights @ (A + A^2 + ...)` for a square, acyclic, row-normalised `a_norm`."""
    term = weights @ a_norm
    total = term.clone()
    for _ in range(max_terms):
        if not bool(term.any()):
            return total
        term = term @ a_norm
        total += term
    raise RuntimeError(f"influence did not vanish after {max_terms} terms: the graph has a cycle")


INFLUENCE_CHUNK_BYTES = 64 * 2**20  # one chunk of normalised rows, whatever the row width


def chunk_rows(width: int, budget: int = INFLUENCE_CHUNK_BYTES) -> int:
    """Rows of `width` fp32 columns that fit `budget` bytes (at least one)."""
    return max(1, budget // (4 * max(width, 1)))


def partial_influence(
    rows: torch.Tensor, row_nodes: torch.Tensor, row_weights: torch.Tensor,
    chunk: int | None = None,
) -> torch.Tensor:  # fmt: skip
    """Influence on the column nodes of a graph of which only some rows are known: `rows`
    `[r, n_cols]`, `row_nodes[i]` the column of row i's node (-1: none, e.g. a logit),
    `row_weights` the starting weight of each row (logit probabilities, 0 elsewhere).

    Rows are normalised `chunk` at a time (default: `chunk_rows`, about 64 MiB), so the only
    row-set-sized tensor is `rows` itself; one chunk of all rows is `normalized(rows)` exactly."""
    step = chunk_rows(rows.shape[1]) if chunk is None else chunk
    if step < 1:
        raise ValueError(f"chunk is {chunk}; give at least 1 row")
    bounds = [(s, min(s + step, rows.shape[0])) for s in range(0, rows.shape[0], step)]
    sums = torch.cat(
        [rows[s:e].abs().sum(1).clamp_min(1e-10) for s, e in bounds] or [rows.new_zeros(0)]
    )
    has_col = row_nodes >= 0
    total = torch.zeros(rows.shape[1], dtype=rows.dtype)
    current = row_weights.to(rows.dtype)
    for _ in range(1000):
        contrib = torch.zeros(rows.shape[1], dtype=rows.dtype)
        for s, e in bounds:
            if bool(current[s:e].any()):  # a chunk of zero weights adds exactly nothing
                contrib += current[s:e] @ rows[s:e].abs().div_(sums[s:e, None])
        total += contrib
        current = torch.where(has_col, contrib[row_nodes.clamp_min(0)], torch.zeros_like(current))
        if not bool(current.any()):
            return total
    raise RuntimeError("influence did not vanish after 1000 terms: the graph has a cycle")


__all__ = [
    "INFLUENCE_CHUNK_BYTES",
    "chunk_rows",
    "normalized",
    "normalized_",
    "partial_influence",
    "path_influence",
]
