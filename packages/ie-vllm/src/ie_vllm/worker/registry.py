"""Hooked vLLM's store of registered requests and their captured rows.

A request carries its `RequestSpec` (`ie_vllm.specs`) and key in `SamplingParams.extra_args`
(`layout.SPEC_ARG`, `layout.KEY_ARG`); `lifecycle.Lifecycle` registers it the first time the
request reaches a forward, and drops it when the host collects or releases the key. Captured rows
accumulate per forward (chunked prefill, then one row per decode step), indexed by sequence
position so a recomputed (preempted) request overwrites rather than duplicates.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from ie_core.ops import SteeringOp
from ie_core.reduce import pad_cat

from ie_vllm.row_budget import RowBudget, spill_copy
from ie_vllm.specs import ReducerSpec, RequestSpec
from ie_vllm.worker.lifecycle import Keys


@dataclass
class Rows:
    """Captured rows of one site for one request, in chunks keyed by their first position.

    Chunks `[0, spilled)` were moved to host memory (`spill`); `held` counts the bytes of the
    others, still where they were captured."""

    chunks: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    spilled: int = 0
    held: int = 0

    def add(self, first_pos: int, rows: torch.Tensor) -> None:
        last = self.chunks[-1] if self.chunks else None
        if last is None or last[0] + last[1].shape[0] <= first_pos:
            # The usual step: rows after every kept one. Appending keeps a decode step O(1)
            # instead of re-slicing every earlier chunk (O(steps) per step, per site).
            self.chunks.append((first_pos, rows))
            self.held += rows.nbytes
            return
        # A chunk starting at or before an earlier one means the request was recomputed.
        kept: list[tuple[int, torch.Tensor]] = []
        for pos, t in self.chunks:
            if pos >= first_pos:
                continue
            kept.append((pos, t[: first_pos - pos]))
        self.spilled = min(self.spilled, len(kept))
        kept.append((first_pos, rows))
        self.chunks = kept
        self.held = sum(t.nbytes for _, t in kept[self.spilled :])

    def spill(self, move: Callable[[torch.Tensor], torch.Tensor]) -> int:
        """Move every held chunk with `move`; returns the bytes no longer held."""
        for i in range(self.spilled, len(self.chunks)):
            pos, t = self.chunks[i]
            self.chunks[i] = (pos, move(t))
        self.spilled, freed, self.held = len(self.chunks), self.held, 0
        return freed

    def count(self) -> int:
        return sum(t.shape[0] for _, t in self.chunks)

    def gather(self, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Rows for positions [start, stop), on the device they were captured on unless some
        were spilled (then all on the host)."""
        parts = []
        for pos, t in self.chunks:
            lo = max(start - pos, 0)
            hi = t.shape[0] if stop is None else min(stop - pos, t.shape[0])
            if hi > lo:
                parts.append(t[lo:hi])
        if len({p.device for p in parts}) > 1:
            parts = [p.cpu() for p in parts]
        # A summarising reducer's entries (one per chunk) may differ in size: padded.
        return pad_cat(parts) if parts else torch.empty(0)


@dataclass(frozen=True)
class Judge:
    """A condition judged at this site for a write later in the forward: step `step` of `site`'s
    steering, its op `op_index` (a `Conditional` reading this site's point)."""

    site: str
    step: int
    op_index: int
    op: SteeringOp


@dataclass
class Entry:
    """A registered request in the worker: its spec, its steering by site, and its captures."""

    spec: RequestSpec
    capture_sites: frozenset[str]
    # Per site, the specs' (ops, masked prompt positions) in order: each spec keeps its own mask.
    steer_sites: dict[str, tuple[tuple[tuple[SteeringOp, ...], frozenset[int]], ...]]
    rows: dict[str, Rows] = field(default_factory=dict)
    # Per site, the reducers reading it; their outputs go to `rows` under `label|output`.
    reduce_sites: dict[str, tuple[ReducerSpec, ...]] = field(default_factory=dict)
    # Per site, the conditions judged there for writes at later sites.
    judge_sites: dict[str, tuple[Judge, ...]] = field(default_factory=dict)

    def sites(self) -> set[str]:
        """Every site this request hooks."""
        return {*self.capture_sites, *self.steer_sites, *self.reduce_sites, *self.judge_sites}


def store_reduced(entry_rows: dict[str, Rows], label: str, first_pos: int, got: dict) -> None:
    """Keep one reducer's outputs for rows from `first_pos` on, as captured rows are kept."""
    for name, t in got.items():
        entry_rows.setdefault(f"{label}|{name}", Rows()).add(first_pos, t)


def gather_reduced(
    entry_rows: dict[str, Rows], reducers: tuple[ReducerSpec, ...], start: int, stop: int | None
) -> dict[str, torch.Tensor]:
    """Every reducer output for positions [start, stop), keyed `label|output`."""
    labels = tuple(f"{r.label}|" for r in reducers)
    return {k: v.gather(start, stop) for k, v in entry_rows.items() if k.startswith(labels)}


class Registry(Keys[Entry]):
    """Hooked vLLM's registered requests (`lifecycle.Keys`) and the bytes of their rows held on
    the device against the worker's `RowBudget` (`ie_vllm.row_budget`)."""

    def __init__(self, budget: RowBudget | None = None) -> None:
        super().__init__()
        self.budget = budget
        self.held = 0  # bytes of rows still where they were captured, every entry together
        self.spilled = 0  # bytes moved to host memory since the worker started

    def pop(self, key: str) -> Entry | None:
        entry = super().pop(key)
        if entry is not None:
            self.held -= sum(r.held for r in entry.rows.values())
        return entry

    def keep(self, entry: Entry, name: str, first_pos: int, rows: torch.Tensor) -> None:
        """Store `entry`'s rows of `name` from `first_pos` on, within the budget."""
        kept = entry.rows.setdefault(name, Rows())
        before = kept.held
        kept.add(first_pos, rows)
        self.held += kept.held - before
        self._settle()

    def keep_reduced(self, entry: Entry, label: str, first_pos: int, got: dict) -> None:
        """`store_reduced` within the budget."""
        for name, t in got.items():
            self.keep(entry, f"{label}|{name}", first_pos, t)

    def _settle(self) -> None:
        """Past the limit, move the rows of the oldest requests to host memory until under it."""
        budget = self.budget
        if budget is None or not budget.spills or self.held <= budget.limit:
            return
        for entry in self.entries.values():  # registration order: the oldest first
            for rows in entry.rows.values():
                if rows.held:
                    freed = rows.spill(spill_copy)
                    self.held -= freed
                    self.spilled += freed
            if self.held <= budget.limit:
                return
