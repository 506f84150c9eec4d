"""FeatureClamp's float32 range: an accepted op is finite on every row of norm up to
ROW_NORM_MAX (its delta is computed in float64), and an op that could leave float32 there is
refused when it is built, naming the bound."""

from __future__ import annotations

import pytest
import torch
from ie_core.errors import SteeringSpecError
from ie_core.ops import ROW_NORM_MAX, FeatureClamp, delta_bound
from ie_core.ops.apply import apply_ops, check_ops_fit
from ie_core.ops.values import FLOAT32_MAX


def _fp32_delta(h: torch.Tensor, op: FeatureClamp) -> torch.Tensor:
    """The clamp written naively in float32 (the negative control)."""
    p = h @ torch.tensor(op.encoder) + op.bias
    act = torch.relu(p) * (p > op.threshold)
    return (op.value - act).unsqueeze(-1) * torch.tensor(op.decoder)


def test_a_clamp_at_the_bound_is_finite_where_float32_products_overflow() -> None:
    # |encoder| * max|decoder| * ROW_NORM_MAX = 1e38: accepted, and h . encoder = 1e68 on this row.
    op = FeatureClamp([1e38, 0.0], [1e-30, 1e-30], value=2.0)
    h = torch.tensor([[ROW_NORM_MAX, 0.0]])
    out = apply_ops(h, [op])
    assert torch.isfinite(out).all()
    want = h.double() + (2.0 - 1e68) * torch.tensor([1e-30, 1e-30], dtype=torch.float64)
    assert torch.allclose(out.double(), want, rtol=1e-6)
    # Negative control: the same op in float32 arithmetic overflows to inf.
    assert not torch.isfinite(h + _fp32_delta(h, op)).all()


def test_float64_math_equals_the_float32_formula_at_ordinary_scales() -> None:
    g = torch.Generator().manual_seed(0)
    enc, dec = torch.randn(16, generator=g), torch.randn(16, generator=g)
    op = FeatureClamp(enc, dec, bias=0.3, threshold=0.1, value=4.0)
    h = 3.0 * torch.randn(5, 16, generator=g)
    got = apply_ops(h, [op])
    want = h + _fp32_delta(h, op)
    assert float((got - want).abs().max()) <= 1e-5 * float(h.abs().max())
    assert float((got - h).abs().max()) > 0.1  # the clamp changes the rows


@pytest.mark.parametrize(
    "fields",
    [
        {"encoder": [1e39], "decoder": [1.0]},  # beyond float32 itself
        {"encoder": [1e10, 1e10], "decoder": [1.0, 1.0]},  # gain 1.4e10: 1.4e40 on a 1e30 row
        {"encoder": [1.0], "decoder": [3e38], "value": 1.0},  # value * decoder alone
        {"encoder": [1e-30], "decoder": [1e38], "bias": 10.0},  # bias * decoder
    ],
)
def test_a_clamp_that_could_overflow_is_refused_when_built(fields: dict) -> None:
    with pytest.raises(SteeringSpecError, match="float32"):
        FeatureClamp(**fields)


def test_the_bound_is_the_one_checked() -> None:
    enc, dec = (1.0, 0.0), (0.5, -2.0)
    assert delta_bound(enc, dec, -3.0, 4.0) == (4.0 + 3.0 + ROW_NORM_MAX) * 2.0
    edge = FLOAT32_MAX / 2 / ROW_NORM_MAX  # |encoder| * max|decoder| at the limit
    FeatureClamp([edge * 0.99], [1.0])
    with pytest.raises(SteeringSpecError, match="rescale"):
        FeatureClamp([edge * 1.01], [1.0])


def test_half_precision_models_refuse_a_value_beyond_their_range() -> None:
    op = FeatureClamp([1.0, 0.0], [1.0, 1.0], value=1e5)
    check_ops_fit([op], torch.float32, "resid_post.0")
    with pytest.raises(SteeringSpecError, match="float16 max"):
        check_ops_fit([op], torch.float16, "resid_post.0")
