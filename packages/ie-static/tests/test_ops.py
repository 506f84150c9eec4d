"""The write tap's math equals `ie_core.ops.apply.apply_ops`, row by row, on CPU tensors."""

from __future__ import annotations

import pytest
import torch
from ie_core.ops import (
    Additive,
    LensAblate,
    LensSteer,
    LensSwap,
    Orthogonal,
    Patch,
    ProjectionCap,
    Scale,
)
from ie_core.ops.apply import apply_ops
from ie_static import ops
from ie_static.tables import TableShape, WriteTable

D = 24
TOL = 1e-5  # fp32, one backend: only the dot product's summation order differs


def _vec(seed: int) -> tuple[float, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(D, generator=g).tolist())


EVERY_KIND = {
    "additive": (Additive(_vec(1), 3.0),),
    "orthogonal": (Orthogonal(_vec(2), 0.25),),
    "projection_cap": (ProjectionCap(_vec(3), min=-0.5, max=0.75),),
    "cap_min_only": (ProjectionCap(_vec(3), min=1.0),),
    "lens_steer": (LensSteer(_vec(4), 0.6, 0.3),),
    "lens_steer_negative": (LensSteer(_vec(4), -2.0, 0.5),),
    "lens_ablate": (LensAblate(_vec(5)),),
    "lens_swap": (LensSwap(_vec(6), _vec(7)),),
    "chain": (Additive(_vec(8), -1.5), Orthogonal(_vec(9), 2.0), LensSwap(_vec(10), _vec(11))),
    "scale": (Scale(0.5),),
    "zero_ablate": (Scale(0.0),),
    "scale_heads": (Scale(-2.0, heads=(1, 3), head_dim=6),),
    "patch_everywhere": (Patch(_vec(12)),),
    "patch_positions": (Patch([_vec(13), _vec(14)], positions=(1, 3)),),
    "patch_broadcast_heads": (Patch(_vec(15), positions=(0, 2, 3), heads=(2,), head_dim=6),),
    "patch_then_steer": (Patch([_vec(16)], positions=(2,)), Additive(_vec(17), 0.5), Scale(3.0)),
}

SHAPE = TableShape(slots=4, ops=3, masks=2, positions=16)


def _inputs(n: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(n, D, generator=g) * 2.0).to(dtype)
    positions = torch.arange(n) % SHAPE.positions
    return x, positions


def _run(table: WriteTable, x, positions, row_slot, masks) -> torch.Tensor:
    a, c, v, m, *affine = table.tensors()
    return ops.write_tap(x, positions, row_slot, a, c, v, m, masks, *affine)


@pytest.mark.parametrize("name", list(EVERY_KIND))
def test_each_kind_matches_apply_ops(name: str) -> None:
    chain = EVERY_KIND[name]
    table = WriteTable.empty(SHAPE, D, torch.device("cpu"))
    table.fill(2, [(op, -1) for op in chain])
    x, positions = _inputs(10)
    row_slot = torch.tensor([2] * 10, dtype=torch.int32)
    masks = torch.zeros(SHAPE.slots, SHAPE.masks, SHAPE.positions, dtype=torch.bool)
    got = _run(table, x, positions, row_slot, masks)
    want = apply_ops(x, chain, positions=positions)
    assert (got - want).abs().max().item() <= TOL
    # Negative control: the steering moved the rows, so equality above is not vacuous.
    assert (want - x).abs().max().item() > 1e-2


def test_mixed_rows_masks_and_unsteered_rows_bit_identical() -> None:
    table = WriteTable.empty(SHAPE, D, torch.device("cpu"))
    chain_a = EVERY_KIND["chain"]
    chain_b = EVERY_KIND["projection_cap"]
    table.fill(0, [(op, 0) for op in chain_a])  # masked by mask 0 of slot 0
    table.fill(3, [(op, -1) for op in chain_b])
    # Rows: request A (slot 0) at positions 0..4, unsteered request (-1) 3 rows, B (slot 3) 3 rows.
    x, _ = _inputs(11)
    positions = torch.tensor([0, 1, 2, 3, 4, 0, 1, 2, 7, 8, 9])
    row_slot = torch.tensor([0] * 5 + [-1] * 3 + [3] * 3, dtype=torch.int32)
    masks = torch.zeros(SHAPE.slots, SHAPE.masks, SHAPE.positions, dtype=torch.bool)
    masks[0, 0, torch.tensor([0, 3])] = True  # A leaves prompt positions 0 and 3 unsteered
    got = _run(table, x, positions, row_slot, masks)

    rows_a = torch.tensor([False, True, True, False, True])
    want_a = apply_ops(x[:5], chain_a, rows_a)
    want_b = apply_ops(x[8:], chain_b)
    assert (got[:5] - want_a).abs().max().item() <= TOL
    assert torch.equal(got[[0, 3]], x[[0, 3]])  # masked rows untouched, bit for bit
    assert torch.equal(got[5:8], x[5:8])  # unsteered request untouched
    assert (got[8:] - want_b).abs().max().item() <= TOL
    # Negative control: ignoring the mask would have changed rows 0 and 3.
    assert (apply_ops(x[:5], chain_a)[[0, 3]] - x[[0, 3]]).abs().max().item() > 1e-2


def test_per_op_masks_apply_only_to_their_op() -> None:
    """Two specs at one site with different masks: each op honours its own mask."""
    table = WriteTable.empty(SHAPE, D, torch.device("cpu"))
    op1, op2 = Additive(_vec(20), 1.0), Orthogonal(_vec(21), 0.0)
    table.fill(1, [(op1, 0), (op2, 1)])
    x, _ = _inputs(4)
    positions = torch.tensor([0, 1, 2, 3])
    row_slot = torch.full((4,), 1, dtype=torch.int32)
    masks = torch.zeros(SHAPE.slots, SHAPE.masks, SHAPE.positions, dtype=torch.bool)
    masks[1, 0, 0] = True
    masks[1, 1, 1] = True
    got = _run(table, x, positions, row_slot, masks)
    want = apply_ops(x, (op1,), torch.tensor([False, True, True, True]))
    want = apply_ops(want, (op2,), torch.tensor([True, False, True, True]))
    assert (got - want).abs().max().item() <= TOL


def test_bf16_cast_back() -> None:
    chain = EVERY_KIND["chain"]
    table = WriteTable.empty(SHAPE, D, torch.device("cpu"))
    table.fill(0, [(op, -1) for op in chain])
    x, positions = _inputs(6, torch.bfloat16)
    row_slot = torch.zeros(6, dtype=torch.int32)
    masks = torch.zeros(SHAPE.slots, SHAPE.masks, SHAPE.positions, dtype=torch.bool)
    got = _run(table, x, positions, row_slot, masks)
    want = apply_ops(x, chain)
    assert got.dtype == torch.bfloat16
    # One bf16 rounding step of the result apart at most.
    assert ((got.float() - want.float()).abs() <= want.float().abs() * 2**-7 + 1e-6).all()


def test_fast_path_when_host_says_nothing_is_steered() -> None:
    table = WriteTable.empty(SHAPE, D, torch.device("cpu"))
    table.fill(0, [(EVERY_KIND["additive"][0], -1)])
    x, positions = _inputs(3)
    row_slot = torch.full((3,), -1, dtype=torch.int32)
    masks = torch.zeros(SHAPE.slots, SHAPE.masks, SHAPE.positions, dtype=torch.bool)
    ops.STEP.any_steered = False
    try:
        out = _run(table, x, positions, row_slot, masks)
    finally:
        ops.STEP.any_steered = True
    assert torch.equal(out, x) and out.data_ptr() != x.data_ptr()


def test_cpu_write_tap_computes_only_written_rows_and_equals_the_branch_free_kernel() -> None:
    """#44: on the CPU the tap runs the math on the rows whose slot has an op at this site; the
    result equals the branch-free kernel (what a CUDA graph runs over every row) bit for bit."""
    table = WriteTable.empty(SHAPE, D, torch.device("cpu"))
    table.fill(1, [(op, -1) for op in EVERY_KIND["patch_then_steer"]])
    table.fill(3, [(op, -1) for op in EVERY_KIND["chain"]])
    x, _ = _inputs(12)
    positions = torch.tensor([0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 4])
    # slot 1 and 3 write here; slot 2 is a request with nothing at this site; -1 is unsteered.
    row_slot = torch.tensor([1] * 4 + [2] * 3 + [-1] * 2 + [3] * 3, dtype=torch.int32)
    masks = torch.zeros(SHAPE.slots, SHAPE.masks, SHAPE.positions, dtype=torch.bool)
    got = _run(table, x, positions, row_slot, masks)
    a, c, v, m, *affine = table.tensors()
    branch_free = ops.steer_rows(x, positions, row_slot, a, c, v, m, masks, *affine)
    assert torch.equal(got, branch_free)
    assert torch.equal(got[4:9], x[4:9])  # the rows no op touches, bit for bit
    # Negative control: the written rows moved, so a tap that skipped them would differ.
    assert (got[:4] - x[:4]).abs().max().item() > 1e-2
    assert (got[9:] - x[9:]).abs().max().item() > 1e-2
    empty = WriteTable.empty(SHAPE, D, torch.device("cpu"))  # a site no request writes
    out = _run(empty, x, positions, row_slot, masks)
    assert torch.equal(out, x) and out.data_ptr() != x.data_ptr()


def test_read_taps_skip_the_copy_when_host_says_nothing_is_captured() -> None:
    buf = torch.zeros(8, D)
    h, r = torch.randn(5, D), torch.randn(5, D)
    ops.STEP.any_captured = False
    try:
        ops.read_tap(h, buf)
        ops.read_sum_tap(h, r, buf)
        assert torch.equal(buf, torch.zeros(8, D))
        with pytest.raises(RuntimeError, match="exceed the tap buffer"):
            ops.read_tap(torch.randn(9, D), buf)  # the guard still runs
    finally:
        ops.STEP.any_captured = True
    ops.read_sum_tap(h, r, buf)  # negative control: with a capture the rows are written
    assert torch.equal(buf[:5], h + r)


def test_read_taps_copy_rows_and_refuse_overflow() -> None:
    buf = torch.zeros(8, D)
    h, r = torch.randn(5, D), torch.randn(5, D)
    ops.read_tap(h, buf)
    assert torch.equal(buf[:5], h)
    ops.read_sum_tap(h, r, buf)
    assert torch.equal(buf[:5], h + r)
    with pytest.raises(RuntimeError, match="exceed the tap buffer"):
        ops.read_tap(torch.zeros(9, D), buf)


def test_ops_survive_torch_compile() -> None:
    """Inductor keeps the opaque calls: compiled output and the buffer equal eager's."""
    table = WriteTable.empty(SHAPE, D, torch.device("cpu"))
    table.fill(1, [(op, -1) for op in EVERY_KIND["chain"]])
    masks = torch.zeros(SHAPE.slots, SHAPE.masks, SHAPE.positions, dtype=torch.bool)
    buf = torch.zeros(16, D)
    row_slot = torch.tensor([1, 1, -1, 1], dtype=torch.int32)

    def f(x, positions):
        y = torch.relu(x) * 2.0
        a, c, v, m, *affine = table.tensors()
        y = ops.write_tap(y, positions, row_slot, a, c, v, m, masks, *affine)
        ops.read_tap(y, buf)
        return y + 1.0

    x, positions = _inputs(4)
    want = f(x, positions)
    want_buf = buf[:4].clone()
    buf.zero_()
    got = torch.compile(f, fullgraph=True, dynamic=True)(x, positions)
    assert torch.equal(buf[:4], want_buf)
    assert (got - want).abs().max().item() <= TOL
    assert buf[:4].abs().sum() > 0
