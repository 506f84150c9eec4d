"""The bound on rows a hooked worker holds on its device (`ie_vllm.row_budget`, `Registry.keep`),
and the host's refusal of a request whose rows alone exceed it. No engine: the registry is the
worker's own class, fed tensors as the capture hook feeds it. On this CPU the spill's move is the
real `spill_copy` into (unpinned) host memory; on CUDA the same code pins the copy."""

from __future__ import annotations

import pytest
import torch
from ie_core.errors import UnsupportedOperationError
from ie_vllm.row_budget import (
    CPU_LIMIT_BYTES,
    GIB,
    ROW_LIMIT_ENV,
    RowBudget,
    capture_bytes,
    check_request,
    device_budget,
    smallest_limit,
)
from ie_vllm.specs import RequestSpec
from ie_vllm.worker.registry import Entry, Registry

WIDTH = 64
ROW_BYTES = WIDTH * 4  # float32


def _entry(key: str) -> Entry:
    return Entry(RequestSpec(key, ("resid_post.0",)), frozenset({"resid_post.0"}), {})


def _feed(registry: Registry, keys: list[str], steps: int, prompt: int) -> dict[str, list]:
    """A prefill of `prompt` rows then `steps` decode rows for each key, interleaved as a batch
    is; returns what was fed per key (the independent record)."""
    fed: dict[str, list] = {k: [] for k in keys}
    g = torch.Generator().manual_seed(0)
    for k in keys:
        registry.add(_entry(k))
    for step in range(steps + 1):
        n, first = (prompt, 0) if step == 0 else (1, prompt + step - 1)
        for k in keys:
            rows = torch.randn(n, WIDTH, generator=g)
            fed[k].append(rows)
            registry.keep(registry.entries[k], "resid_post.0", first, rows.clone())
            budget = registry.budget
            if budget is not None and budget.spills:
                assert registry.held <= budget.limit  # after every step: the bound holds
    return fed


def test_past_the_limit_the_oldest_rows_move_off_the_device_and_stay_exact() -> None:
    limit = 40 * ROW_BYTES
    registry = Registry(RowBudget(limit, spills=True))
    keys = ["a", "b", "c"]
    fed = _feed(registry, keys, steps=10, prompt=8)
    total = sum(t.nbytes for k in keys for t in fed[k])  # 3 x 18 rows
    assert total == 3 * 18 * ROW_BYTES > limit
    assert registry.held <= limit and registry.spilled >= total - limit
    assert registry.held + registry.spilled >= total  # every byte accounted (re-spills add)
    assert registry.entries["a"].rows["resid_post.0"].spilled > 0
    for k in keys:
        got = registry.entries[k].rows["resid_post.0"].gather()
        assert torch.equal(got, torch.cat(fed[k]))  # moved, not changed
    for k in keys:
        registry.pop(k)
    assert registry.held == 0


def test_without_the_bound_the_same_work_holds_every_byte() -> None:
    """Negative control: no budget (the previous registry) or one that cannot move rows (the
    CPU's) holds all 54 rows where they were captured, over the limit above."""
    for budget in (None, RowBudget(40 * ROW_BYTES, spills=False)):
        registry = Registry(budget)
        fed = _feed(registry, ["a", "b", "c"], steps=10, prompt=8)
        assert registry.held == sum(t.nbytes for k in fed for t in fed[k]) == 54 * ROW_BYTES
        assert registry.spilled == 0


def test_the_oldest_request_moves_first_and_only_as_much_as_needed() -> None:
    registry = Registry(RowBudget(20 * ROW_BYTES, spills=True))
    for k in ("a", "b", "c"):
        registry.add(_entry(k))
        registry.keep(registry.entries[k], "resid_post.0", 0, torch.ones(8, WIDTH))
    held = {k: e.rows["resid_post.0"].held for k, e in registry.entries.items()}
    assert held == {"a": 0, "b": 8 * ROW_BYTES, "c": 8 * ROW_BYTES}  # 24 rows > 20: a moved
    assert registry.held == 16 * ROW_BYTES and registry.spilled == 8 * ROW_BYTES


def test_a_recomputed_request_is_accounted_after_a_spill() -> None:
    registry = Registry(RowBudget(6 * ROW_BYTES, spills=True))
    registry.add(_entry("a"))
    entry = registry.entries["a"]
    registry.keep(entry, "resid_post.0", 0, torch.ones(4, WIDTH))
    registry.keep(entry, "resid_post.0", 4, torch.ones(4, WIDTH))  # 8 rows > 6: all spilled
    assert registry.held == 0 and registry.spilled == 8 * ROW_BYTES
    registry.keep(entry, "resid_post.0", 2, 2 * torch.ones(3, WIDTH))  # preempted, recomputed
    rows = entry.rows["resid_post.0"]
    assert registry.held == rows.held == 3 * ROW_BYTES
    assert rows.gather().shape[0] == 5 and torch.equal(rows.gather()[2:], 2 * torch.ones(3, WIDTH))


def test_the_default_limit_and_its_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ROW_LIMIT_ENV, raising=False)
    assert device_budget(torch.device("cpu")) == RowBudget(CPU_LIMIT_BYTES, spills=False)
    monkeypatch.setenv(ROW_LIMIT_ENV, "0.5")
    assert device_budget(torch.device("cpu")).limit == GIB // 2
    for bad in ("lots", "0", "-1"):
        monkeypatch.setenv(ROW_LIMIT_ENV, bad)
        with pytest.raises(UnsupportedOperationError, match=ROW_LIMIT_ENV):
            device_budget(torch.device("cpu"))
    assert smallest_limit([3, 2, None]) == 2 and smallest_limit([]) is None


def test_a_request_whose_rows_alone_cannot_fit_is_refused_with_the_number() -> None:
    widths = {f"resid_post.{i}": 576 for i in range(30)} | {"attn_probs.3": 9}
    captures = list(widths)[:30]
    # 30 layers x (100 prompt + 200 new) rows x 576 x 4 bytes, computed independently
    need = 30 * 300 * 576 * 4
    assert capture_bytes(widths, 576, captures, 300, 4) == need == 20_736_000
    check_request(widths, 576, captures, 300, torch.float32, need, "vllm")  # fits exactly
    with pytest.raises(UnsupportedOperationError) as refused:
        check_request(widths, 576, captures, 300, torch.float32, need - 1, "vllm")
    text = str(refused.value)
    assert "20,736,000 bytes" in text and "20,735,999 bytes" in text
    assert "300 positions x 30 addresses in float32" in text and ROW_LIMIT_ENV in text
    # an attention map is held as its q and k rows: 2 x d_model per position
    assert capture_bytes(widths, 576, ["attn_probs.3"], 10, 2) == 10 * 2 * 576 * 2
