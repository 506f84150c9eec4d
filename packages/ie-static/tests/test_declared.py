"""Declared sets, the buffer budget and load-time refusals: no engine needed."""

from __future__ import annotations

import pytest
from ie_core.errors import LayerOutOfRangeError, PointUnavailableError, UnsupportedOperationError
from ie_static.backend import declared_sets, describe, load
from ie_static.memory import MIN_ROWS, BufferBudgetError, plan_buffers
from ie_static.tables import TableShape, table_bytes

SHAPE = TableShape(slots=16, ops=4, masks=4, positions=2048)


def test_auto_reads_every_resid_post_and_writes_the_same() -> None:
    reads, writes = declared_sets("auto", "auto", 3)
    assert reads == ("resid_post.0", "resid_post.1", "resid_post.2")
    assert writes == reads


def test_explicit_lists_bare_names_and_narrowed_writes() -> None:
    reads, writes = declared_sets(["resid_pre", "attn_out.1"], ["attn_out.1"], 2)
    assert reads == ("resid_pre.0", "resid_pre.1", "attn_out.1")
    assert writes == ("attn_out.1",)
    assert declared_sets("auto", [], 2)[1] == ()


@pytest.mark.parametrize(
    ("points", "writes", "error", "match"),
    [
        (["mlp_act.0"], "auto", PointUnavailableError, "taps only resid_pre"),
        (["resid_post.9"], "auto", LayerOutOfRangeError, "out of range"),
        (["resid_post.0"], ["resid_post.1"], ValueError, "not among static_points"),
        ("resid_post", "auto", ValueError, "'auto' or a list"),
        ([], "auto", ValueError, "empty"),
        (["embeddings"], "auto", PointUnavailableError, "taps only"),
    ],
)
def test_bad_declarations_are_refused(points, writes, error, match) -> None:
    with pytest.raises(error, match=match):
        declared_sets(points, writes, 4)


def test_describe_summarizes_ranges() -> None:
    assert describe([f"resid_post.{i}" for i in range(30)]) == "resid_post at layers 0..29"
    assert describe(["attn_out.1", "attn_out.5"]) == "attn_out at layers 1, 5"


def test_budget_fits_rows_or_refuses_with_numbers() -> None:
    per_row = 30 * 576 * 4
    tables = 30 * table_bytes(SHAPE, 576) + 16 * 4 * 2048
    plan = plan_buffers(
        n_reads=30, n_writes=30, width=576, dtype_bytes=4, shape=SHAPE,
        budget_bytes=2**30, requested_rows=None, default_rows=2048,
    )  # fmt: skip
    assert plan.rows == 2048 and plan.read_bytes == 2048 * per_row
    assert plan.table_bytes == tables
    small = plan_buffers(
        n_reads=30, n_writes=30, width=576, dtype_bytes=4, shape=SHAPE,
        budget_bytes=tables + 500 * per_row, requested_rows=None, default_rows=2048,
    )  # fmt: skip
    assert small.rows == 500  # the default shrinks to what fits
    with pytest.raises(BufferBudgetError, match=r"lower max_num_batched_tokens to 500"):
        plan_buffers(
            n_reads=30, n_writes=30, width=576, dtype_bytes=4, shape=SHAPE,
            budget_bytes=tables + 500 * per_row, requested_rows=1024, default_rows=2048,
        )  # fmt: skip
    with pytest.raises(BufferBudgetError, match=f"fewer than the {MIN_ROWS}"):
        plan_buffers(
            n_reads=30, n_writes=30, width=576, dtype_bytes=4, shape=SHAPE,
            budget_bytes=tables + 100 * per_row, requested_rows=None, default_rows=2048,
        )  # fmt: skip


def test_enforce_eager_is_refused_before_any_engine_starts() -> None:
    with pytest.raises(UnsupportedOperationError, match="backend='vllm'"):
        load("ie-synthetic/llama", enforce_eager=True)
