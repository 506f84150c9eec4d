"""vllm-static's taps on a plain module, uncompiled (no engine): a write site on a module's input
and on its output steer exactly as `ie_core.ops.apply.apply_ops`, a read site records the
post-intervention rows, a read-only `(hidden, residual)` site records their sum, and the write
tables' bookkeeping (an unfilled slot equals a cleared one, the memory plan equals the tables).

Tolerance: 1e-5 (fp32, one backend; the tap and apply_ops sum the dot product in another order)."""

from __future__ import annotations

import pytest
import torch
from ie_core.errors import SteeringSpecError
from ie_core.ops import Additive, FeatureClamp, Orthogonal, Patch, Scale
from ie_core.ops.apply import apply_ops
from ie_static import ops
from ie_static.tables import TableShape, WriteTable, encode_op, table_bytes
from ie_static.taps import Site, StepInputs, install
from ie_vllm import SiteDef
from ie_vllm.worker.access import post_first, post_out, post_sum, pre_arg
from torch import nn

D, N = 8, 5
TOL = 1e-5
SHAPE = TableShape(slots=3, ops=2, masks=2, positions=16, patch_rows=4)
G = torch.Generator().manual_seed(0)


def _vec(scale: float = 1.0) -> tuple[float, ...]:
    return tuple((torch.randn(D, generator=G) * scale).tolist())


class Mixer(nn.Module):
    """out = x @ W + bias, with `bias` passed by keyword (so the writer must keep kwargs)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.randn(D, D, generator=G)

    def forward(self, x: torch.Tensor, *, bias: torch.Tensor) -> torch.Tensor:
        return x @ self.weight + bias


class Layer(nn.Module):
    """A vLLM-style decoder layer: returns `(hidden, residual)`."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * 2.0, x + 1.0


def _step(n: int = N) -> StepInputs:
    # Persistent buffers are longer than the batch: the taps read their first n rows.
    positions = torch.arange(n + 3)
    row_slot = torch.tensor([1] * n + [-1] * 3, dtype=torch.int32)
    return StepInputs(positions, row_slot, torch.zeros(3, 2, 16, dtype=torch.bool))


def _table(chain) -> WriteTable:
    table = WriteTable.empty(SHAPE, D, torch.device("cpu"))
    table.fill(1, [(op, -1) for op in chain])
    return table


def test_write_sites_before_and_after_a_module_steer_like_apply_ops() -> None:
    module, step = Mixer(), _step()
    x, bias = torch.randn(N, D, generator=G), torch.randn(D, generator=G)
    before = (Additive(_vec(), 0.7), Orthogonal(_vec(), 0.2))
    after = (Scale(0.5), Additive(_vec(), -1.2))
    read, write = pre_arg("x", 0)
    pre = Site("in", SiteDef("in", module, "pre", read, write, D), step, table=_table(before))
    read, write = post_out()
    buf = torch.zeros(N + 3, D)
    post = Site(
        "out", SiteDef("out", module, "post", read, write, D), step, buf=buf, table=_table(after)
    )
    want_in = apply_ops(x, before)
    want = apply_ops(want_in @ module.weight + bias, after)
    installed = install([pre, post], step)
    got = module(x, bias=bias)
    torch.testing.assert_close(got, want, rtol=TOL, atol=TOL)
    torch.testing.assert_close(buf[:N], want, rtol=TOL, atol=TOL)  # captured after the write
    assert installed.write_sites() == {"in": pre, "out": post}
    assert installed.read_sites() == {"out": post}
    # Negative control: the unsteered forward is far from the steered one.
    assert (x @ module.weight + bias - want).abs().max() > 0.1


def test_a_read_only_residual_pair_site_records_the_sum_and_leaves_the_output() -> None:
    layer, step = Layer(), _step()
    read, _ = post_sum()
    buf = torch.zeros(N + 3, D)
    where = SiteDef("resid", layer, "post", read, None, D, kind="residual_pair")
    site = Site("resid", where, step, buf=buf)
    assert site.sum_only
    install([site], step)
    x = torch.randn(N, D, generator=G)
    h, r = layer(x)
    assert torch.equal(h, x * 2.0) and torch.equal(r, x + 1.0)
    assert torch.equal(buf[:N], h + r)
    # A read of a plain tensor site, or a residual pair that is also written, is no sum-only tap.
    assert not Site("t", SiteDef("t", layer, "post", read, None, D), step, buf=buf).sum_only
    written = SiteDef("w", layer, "post", read, post_sum()[1], D, kind="residual_pair")
    assert not Site("w", written, step, table=_table((Scale(2.0),))).sum_only


def test_an_unfilled_slot_equals_a_cleared_one_and_the_plan_equals_the_tables() -> None:
    empty = WriteTable.empty(SHAPE, D, torch.device("cpu"))
    cleared = WriteTable.empty(SHAPE, D, torch.device("cpu"))
    cleared.fill(0, [(Patch([_vec()], positions=(1,)), 0), (Additive(_vec()), 1)])
    cleared.clear(0)
    for a, b in zip(empty.tensors(), cleared.tensors(), strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
    want = (torch.bool, torch.float32, torch.float32, torch.int32, torch.bool, torch.bool)
    want += (torch.float32, torch.int64, torch.float32)
    assert tuple(t.dtype for t in empty.tensors()) == want
    assert not empty.active.any() and (empty.mask_idx == -1).all() and (empty.mul == 1).all()
    assert (empty.patch_pos == -1).all() and not empty.coef.any() and not empty.vecs.any()
    assert empty.nbytes() == table_bytes(SHAPE, D)
    assert (
        table_bytes(TableShape(2, 3, 1, 8, 5), 4)
        == WriteTable.empty(TableShape(2, 3, 1, 8, 5), 4, torch.device("cpu")).nbytes()
    )


def test_a_relu_feature_clamp_is_encoded_exactly() -> None:
    op = FeatureClamp(_vec(), _vec(), bias=0.3, value=2.5)
    x = torch.randn(N, D, generator=G) * 2
    step = _step()
    a, c, v, m, *affine = _table((op,)).tensors()
    got = ops.write_tap(x, step.positions, step.row_slot, a, c, v, m, step.masks, *affine)
    torch.testing.assert_close(got, apply_ops(x, (op,)), rtol=TOL, atol=TOL)
    with pytest.raises(SteeringSpecError) as info:
        encode_op(FeatureClamp(_vec(), _vec(), threshold=0.5))
    assert str(info.value).startswith("unknown steering op FeatureClamp(")
    with pytest.raises(SteeringSpecError) as info:
        encode_op(Scale(2.0))
    assert str(info.value) == "scale has no vector to encode; it is an affine op"


def test_patch_rows_fill_to_capacity_and_one_row_broadcasts() -> None:
    x, step = torch.randn(N, D, generator=G), _step()
    row = _vec()
    full = Patch([row], positions=(0, 1, 2, 3))  # as many positions as patch rows
    a, c, v, m, *affine = _table((full,)).tensors()
    got = ops.write_tap(x, step.positions, step.row_slot, a, c, v, m, step.masks, *affine)
    torch.testing.assert_close(got, apply_ops(x, (full,), positions=step.positions[:N]))
    assert torch.equal(got[4], x[4]) and torch.equal(got[0], torch.tensor(row))
    with pytest.raises(SteeringSpecError) as info:
        _table((Patch([row], positions=(0, 1, 2, 3, 4)),))
    assert str(info.value) == (
        "a Patch of 5 positions exceeds this vllm-static engine's 4 patch rows per site; reload "
        "with static_patch_rows=5 or more, or use backend='vllm'"
    )


def test_fill_refusals_read_exactly() -> None:
    with pytest.raises(SteeringSpecError) as info:
        _table((Additive(_vec()), Additive(_vec()), Additive(_vec())))
    assert str(info.value) == (
        "3 steering ops at one site exceed this vllm-static engine's 2 op slots per site; "
        "reload with static_max_ops=3 or more"
    )
    with pytest.raises(SteeringSpecError) as info:
        _table((Patch([_vec()], positions=(0,)), Patch([_vec()], positions=(1,))))
    assert str(info.value) == (
        "vllm-static holds one Patch per site per request (its patch rows are one table per "
        "slot); merge the patches into one Patch with every position, or use backend='vllm'"
    )


def test_a_mask_at_the_last_position_holds_that_row() -> None:
    """A prompt that fills the positions bitmap: its last position's mask bit is read there."""
    x = torch.randn(2, D, generator=G)
    positions = torch.tensor([14, 15])
    row_slot = torch.tensor([1, 1], dtype=torch.int32)
    masks = torch.zeros(3, 2, 16, dtype=torch.bool)
    masks[1, 0, 15] = True
    table = WriteTable.empty(SHAPE, D, torch.device("cpu"))
    table.fill(1, [(Additive(_vec()), 0)])
    a, c, v, m, *affine = table.tensors()
    got = ops.write_tap(x, positions, row_slot, a, c, v, m, masks, *affine)
    assert torch.equal(got[1], x[1]) and not torch.equal(got[0], x[0])


def test_a_written_residual_pair_site_steers_the_sum_and_zeroes_the_residual() -> None:
    """A `(hidden, residual)` output that is written is no sum-only read: the tap steers h + r and
    hands back (steered, 0), as the hooked backend's writer does."""
    layer, step = Layer(), _step()
    read, write = post_sum()
    buf = torch.zeros(N + 3, D)
    chain = (Scale(2.0), Additive(_vec(), 0.5))
    where = SiteDef("resid", layer, "post", read, write, D, kind="residual_pair")
    site = Site("resid", where, step, buf=buf, table=_table(chain))
    assert not site.sum_only
    install([site], step)
    x = torch.randn(N, D, generator=G)
    h, r = layer(x)
    want = apply_ops(x * 2.0 + (x + 1.0), chain)
    torch.testing.assert_close(h, want, rtol=TOL, atol=TOL)
    assert torch.equal(r, torch.zeros_like(r))
    torch.testing.assert_close(buf[:N], want, rtol=TOL, atol=TOL)


def test_every_post_site_of_a_module_runs_after_a_sum_only_one() -> None:
    """A sum-only read is one of several sites on the layer's output: the read-only site after it
    still reads its rows, and both read after the write site, whatever order they came in."""
    layer, step = Layer(), _step()
    sum_buf, first_buf = torch.zeros(N + 3, D), torch.zeros(N + 3, D)
    read, _ = post_sum()
    summed = Site(
        "sum", SiteDef("sum", layer, "post", read, None, D, kind="residual_pair"), step, buf=sum_buf
    )
    read, write = post_first()
    first = Site("first", SiteDef("first", layer, "post", read, write, D), step, buf=first_buf)
    writer = Site(
        "w", SiteDef("w", layer, "post", read, write, D), step, table=_table((Scale(3.0),))
    )
    install([summed, first, writer], step)
    assert layer._ie_static_taps.post == [writer, summed, first]
    x = torch.randn(N, D, generator=G)
    h, r = layer(x)
    torch.testing.assert_close(h, x * 6.0, rtol=TOL, atol=TOL)
    assert torch.equal(r, x + 1.0)
    torch.testing.assert_close(sum_buf[:N], h + r, rtol=TOL, atol=TOL)  # read after the write
    torch.testing.assert_close(first_buf[:N], x * 6.0, rtol=TOL, atol=TOL)


def test_a_read_of_a_written_input_sees_the_write_whatever_the_declared_order() -> None:
    """Two sites on one module input (vLLM's `attn_k`, which attention maps are recomputed from,
    and the `k_rot` point): the read-only one, declared first, still reads the written rows."""
    module, step = Mixer(), _step()
    x, bias = torch.randn(N, D, generator=G), torch.randn(D, generator=G)
    read, write = pre_arg("x", 0)
    buf = torch.zeros(N + 3, D)
    maps = Site("attn_k", SiteDef("attn_k", module, "pre", read, None, D), step, buf=buf)
    chain = (Additive(_vec(), 2.0),)
    point = Site(
        "k_rot", SiteDef("k_rot", module, "pre", read, write, D), step, table=_table(chain)
    )
    install([maps, point], step)
    got = module(x, bias=bias)
    want = apply_ops(x, chain)
    torch.testing.assert_close(buf[:N], want, rtol=TOL, atol=TOL)
    torch.testing.assert_close(got, want @ module.weight + bias, rtol=TOL, atol=TOL)


def test_post_readers_and_writers_get_the_module_arguments() -> None:
    """A reader and writer take `(args, kwargs, output)` as the hooked backend's hook passes them;
    this site reads the output less its input and bias, and adds them back when it writes."""
    module, step = Mixer(), _step()
    x, bias = torch.randn(N, D, generator=G), torch.randn(D, generator=G)

    def read(args, kwargs, out):
        return out - args[0] - kwargs["bias"]

    def write(args, kwargs, out, new):
        return new + args[0] + kwargs["bias"]

    buf = torch.zeros(N + 3, D)
    chain = (Scale(0.5),)
    site = Site(
        "o", SiteDef("o", module, "post", read, write, D), step, buf=buf, table=_table(chain)
    )
    install([site], step)
    got = module(x, bias=bias)
    inner = apply_ops(x @ module.weight - x, chain)
    torch.testing.assert_close(buf[:N], inner, rtol=TOL, atol=TOL)
    torch.testing.assert_close(got, inner + x + bias, rtol=TOL, atol=TOL)


def test_install_taps_every_module_it_is_given_and_keeps_the_step() -> None:
    """Sites on two modules in one install: each module gets its own sites (and only those)."""
    step = _step()
    a, b = Mixer(), Mixer()
    read, write = post_out()
    buf_a, buf_b = torch.zeros(N + 3, D), torch.zeros(N + 3, D)
    site_a = Site("a", SiteDef("a", a, "post", read, write, D), step, buf=buf_a)
    site_b = Site(
        "b", SiteDef("b", b, "post", read, write, D), step, buf=buf_b, table=_table((Scale(2.0),))
    )
    installed = install([site_a, site_b], step)
    assert installed.step is step
    assert installed.sites == {"a": site_a, "b": site_b}
    x, bias = torch.randn(N, D, generator=G), torch.randn(D, generator=G)
    out_a, out_b = a(x, bias=bias), b(x, bias=bias)
    torch.testing.assert_close(out_a, x @ a.weight + bias)
    torch.testing.assert_close(out_b, (x @ b.weight + bias) * 2.0, rtol=TOL, atol=TOL)
    torch.testing.assert_close(buf_a[:N], out_a)
    torch.testing.assert_close(buf_b[:N], out_b)
    assert a._ie_static_taps.post == [site_a] and b._ie_static_taps.post == [site_b]
