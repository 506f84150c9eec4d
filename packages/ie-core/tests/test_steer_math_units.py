"""The parts of the ops' maths around their formulas: the dtype-range refusal a backend
makes when a spec is bound, your own hooks' results, head columns and patch rows."""

from __future__ import annotations

import pytest
import torch
from ie_core.errors import SteeringSpecError
from ie_core.ops import Additive, FeatureClamp, Hook, LensAblate, Patch, ProjectionCap, Scale
from ie_core.ops.apply import apply_ops, check_ops_fit
from ie_core.ops.vectors import head_columns, row_norm

BIG = 7e4  # beyond float16's max (65504), well within float32's


@pytest.mark.parametrize(
    ("op", "what"),
    [
        (Additive([1.0, BIG]), "additive delta reaches 70000"),
        (Additive([1.0, 1.0], coeff=BIG), "additive delta reaches 70000"),
        (Additive([-BIG, 1.0]), "additive delta reaches 70000"),
        (ProjectionCap([1.0, 0.0], min=-BIG), "projection bound 70000"),
        (ProjectionCap([1.0, 0.0], max=BIG), "projection bound 70000"),
        (ProjectionCap([1.0, 0.0], min=-1.0, max=BIG), "projection bound 70000"),
        (Patch([[0.0, -BIG]]), "patch value 70000"),
    ],
)
def test_values_beyond_the_activation_dtype_are_refused(op: object, what: str) -> None:
    with pytest.raises(SteeringSpecError) as err:
        check_ops_fit([op], torch.float16, "resid_post.3")  # type: ignore[list-item]
    message = str(err.value)
    assert message.startswith(f"resid_post.3: {what}, beyond the torch.float16 max 65504")
    assert "load the model in float32" in message
    # The same ops fit float32 and bfloat16 (max 3.4e38), and integer tensors are not checked.
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        check_ops_fit([op], dtype, "resid_post.3")  # type: ignore[list-item]


def test_values_at_the_dtype_max_and_other_ops_fit() -> None:
    edge = float(torch.finfo(torch.float16).max)
    ops = [Additive([edge, 1.0]), ProjectionCap([1.0], max=edge), LensAblate([1.0, 1e30])]
    check_ops_fit(ops, torch.float16, "x")  # type: ignore[arg-type]


def test_a_hook_replaces_keeps_or_is_refused() -> None:
    h = torch.arange(6.0).reshape(1, 2, 3)
    seen: list[tuple[torch.Tensor, str]] = []

    def double(x: torch.Tensor, address: str) -> torch.Tensor:
        seen.append((x.clone(), address))
        return (2 * x).double()

    out = apply_ops(h, [Hook(double, "mlp_out.1")])
    assert torch.equal(out, 2 * h) and out.dtype == h.dtype
    assert seen[0][1] == "mlp_out.1" and torch.equal(seen[0][0], h)
    assert torch.equal(apply_ops(h, [Hook(lambda x, a: None, "mlp_out.1")]), h)
    with pytest.raises(SteeringSpecError, match=r"returned torch\.Size\(\[3\]\); return None or a tensor shaped like its input \(1, 2, 3\)"):  # fmt: skip
        apply_ops(h, [Hook(lambda x, a: torch.zeros(3), "mlp_out.1")])
    with pytest.raises(SteeringSpecError, match=r"the hook at z\.0 returned list"):
        apply_ops(h, [Hook(lambda x, a: [1.0], "z.0")])  # type: ignore[arg-type, return-value]


def test_head_columns_and_patch_rows() -> None:
    cpu = torch.zeros(())
    cols = head_columns((0, 2), 2, 6, cpu)
    assert cols is not None and cols.tolist() == [True, True, False, False, True, True]
    assert head_columns((), None, 6, cpu) is None
    x = torch.zeros(1, 3, 2)
    values, hit = Patch([[1.0, 2.0], [3.0, 4.0]], positions=(7, 5)).rows(
        torch.tensor([[5, 6, 7]]), x
    )
    assert hit.tolist() == [[True, False, True]]
    assert values[0, 0].tolist() == [3.0, 4.0] and values[0, 2].tolist() == [1.0, 2.0]
    with pytest.raises(RuntimeError, match="needs the rows' positions"):
        Patch([[1.0, 2.0]], positions=(1,)).rows(None, x)


def test_head_ops_on_batched_rows() -> None:
    """[batch, seq, width] rows (what backends pass): heads select columns, positions rows."""
    h = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(0))
    scaled = apply_ops(h, [Scale(-1.0, heads=(1,), head_dim=2)])
    want = h.clone()
    want[..., 2:] *= -1
    assert torch.equal(scaled, want)
    positions = torch.tensor([[0, 1, 2], [5, 6, 7]])
    patched = apply_ops(
        h, [Patch([[9.0] * 4], positions=(1, 6), heads=(0,), head_dim=2)], positions=positions
    )
    want = h.clone()
    want[0, 1, :2] = 9.0
    want[1, 1, :2] = 9.0
    assert torch.equal(patched, want)
    rows = apply_ops(h, [Patch([[9.0] * 4], positions=(2,))], positions=positions)
    assert torch.equal(rows[0, 2], torch.full((4,), 9.0)) and torch.equal(rows[1], h[1])


def test_row_norms_are_per_row_across_scales() -> None:
    """Each row is scaled by its own power of two: rows 1e30 and 1e-30 apart keep exact norms
    (one scale for the whole tensor would flush the small row to zero)."""
    h = torch.tensor([[3e30, 4e30], [3e-30, 4e-30], [0.0, 0.0]])
    got = row_norm(h).squeeze(-1)
    assert torch.allclose(got[:2] / torch.tensor([5e30, 5e-30]), torch.ones(2), rtol=1e-6)
    assert got[2] == 0.0


def test_every_op_is_checked_not_only_those_before_an_unchecked_one() -> None:
    ops = [LensAblate([1.0, 0.0]), Scale(2.0), Additive([BIG, 1.0])]
    with pytest.raises(SteeringSpecError, match="additive delta"):
        check_ops_fit(ops, torch.float16, "x")  # type: ignore[arg-type]


def test_feature_clamp_at_its_threshold_is_off() -> None:
    h = torch.tensor([[1.0, 0.0], [2.0, 0.0]])  # p = h . e1 = 1 (at the threshold), 2 (above)
    op = FeatureClamp([1.0, 0.0], [0.0, 1.0], bias=0.0, threshold=1.0, value=5.0)
    out = apply_ops(h, [op])
    assert out[:, 1].tolist() == [5.0, 3.0]  # a = 0 at the threshold, 2 above it


def test_a_patch_of_every_position_hits_every_row_of_a_batch() -> None:
    h = torch.zeros(2, 3, 2)
    values, hit = Patch([1.0, 2.0]).rows(None, h)
    assert hit.shape == (2, 3) and bool(hit.all()) and values.shape == (2, 3, 2)


def test_feature_clamp_delta_is_the_float64_product_rounded_once() -> None:
    # Decoder entries that float32 cannot hold: the delta must be (value - act) * decoder in
    # float64, rounded to float32 once; a decoder rounded to float32 first is off by an ulp.
    decoder = [1 / 3 + k / 7 for k in range(-8, 8)]
    encoder = [0.5] + [0.0] * 15
    h = torch.zeros(1, 16)
    h[0, 0] = 1.0  # p = 1.0 * 0.5 + 0.25 = 0.75 exactly, so act = 0.75 and value - act = 1.25
    op = FeatureClamp(encoder, decoder, bias=0.25, threshold=0.1, value=2.0)
    scale = torch.tensor(1.25, dtype=torch.float64)
    want = (scale * torch.tensor(decoder, dtype=torch.float64)).float()
    got = op.delta(h)
    assert got.dtype == torch.float32
    assert torch.equal(got[0], want)
    # Negative control: the decoder rounded to float32 before the product differs somewhere.
    rounded_first = (scale * torch.tensor(decoder, dtype=torch.float32).double()).float()
    assert not torch.equal(rounded_first, want)
