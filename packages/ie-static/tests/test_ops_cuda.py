"""The static taps on a CUDA device, with torch alone (no vLLM): the write tap equals
`ie_core.ops.apply.apply_ops` (computed on the CPU) for every op kind; inductor's compiled graph
equals the eager call; and a captured CUDA graph replays the taps on new rows with the same answer
and the same read buffer. The last is what vllm-static relies on under vLLM's CUDA graphs: a tap
that synchronised with the host would fail the capture. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch
from ie_core.ops.apply import apply_ops
from ie_static import ops
from ie_static.tables import WriteTable
from test_ops import EVERY_KIND, SHAPE, D, _inputs

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
TOL = 1e-5  # fp32 (TF32 off): only the summation order of the dot products differs


@pytest.fixture(autouse=True)
def _no_tf32() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def _steered(name: str, n: int) -> tuple[WriteTable, torch.Tensor, torch.Tensor, torch.Tensor]:
    cuda = torch.device("cuda")
    table = WriteTable.empty(SHAPE, D, cuda)
    table.fill(2, [(op, -1) for op in EVERY_KIND[name]])
    row_slot = torch.tensor([2] * (n - 2) + [-1, -1], dtype=torch.int32, device=cuda)
    masks = torch.zeros(SHAPE.slots, SHAPE.masks, SHAPE.positions, dtype=torch.bool, device=cuda)
    return table, row_slot, masks, torch.zeros(n, D, device=cuda)


def _taps(table: WriteTable, row_slot, masks, buf):  # type: ignore[no-untyped-def]
    def step(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        a, c, v, m, *affine = table.tensors()
        y = ops.write_tap(x, positions, row_slot, a, c, v, m, masks, *affine)
        ops.read_tap(y, buf)
        return y * 1.0

    return step


def _reference(name: str, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """apply_ops on the CPU for the steered rows; the last two rows (slot -1) untouched."""
    want = x.cpu().clone()
    want[:-2] = apply_ops(want[:-2], EVERY_KIND[name], positions=positions.cpu()[:-2])
    return want


@pytest.mark.parametrize("name", list(EVERY_KIND))
def test_each_kind_on_cuda_matches_apply_ops_eager_compiled_and_graphed(name: str) -> None:
    n = 10
    table, row_slot, masks, buf = _steered(name, n)
    step = _taps(table, row_slot, masks, buf)
    x, positions = (t.cuda() for t in _inputs(n))
    want = _reference(name, x, positions)

    eager = step(x, positions)
    assert (eager.cpu() - want).abs().max().item() <= TOL
    assert torch.equal(buf.cpu(), eager.cpu())
    assert (want[:-2] - x.cpu()[:-2]).abs().max().item() > 1e-2  # the rows moved (not vacuous)

    compiled = torch.compile(step, fullgraph=True)(x, positions)
    assert (compiled - eager).abs().max().item() <= TOL

    static_x, static_pos = x.clone(), positions.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step(static_x, static_pos)  # warm-up outside the capture, as CUDA graphs require
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step(static_x, static_pos)
    fresh = torch.randn(n, D, generator=torch.Generator().manual_seed(7)) * 3.0
    static_x.copy_(fresh.cuda())
    buf.zero_()
    graph.replay()
    torch.cuda.synchronize()
    want_fresh = _reference(name, fresh, positions)
    assert (static_out.cpu() - want_fresh).abs().max().item() <= TOL
    assert torch.equal(buf.cpu(), static_out.cpu())  # the read tap saw the replayed rows
