"""Steering specs are validated at construction; the shared math is checked against plain algebra."""

from __future__ import annotations

import math

import pytest
import torch
from ie_core import (
    Additive,
    LensAblate,
    LensSteer,
    LensSwap,
    Orthogonal,
    PositionMask,
    ProjectionCap,
    Steering,
    steer_at,
)
from ie_core.errors import SteeringSpecError
from ie_core.ops import op_from_dict
from ie_core.ops.apply import apply_ops


@pytest.mark.parametrize(
    "build",
    [
        lambda: Additive([0.0, 0.0]),
        lambda: Additive([1.0, math.nan]),
        lambda: Additive([1.0, math.inf]),
        lambda: Additive([]),
        lambda: Additive([1.0], coeff=math.nan),
        lambda: ProjectionCap([1.0], min=2.0, max=1.0),
        lambda: ProjectionCap([1.0]),
        lambda: LensSteer([1.0], max_fraction=0.0),
        lambda: LensSwap([1.0, 0.0], [1.0]),
        lambda: op_from_dict({"kind": "multiply", "vector": [1.0]}),
        lambda: op_from_dict({"kind": "additive", "vector": [1.0], "bogus": 1}),
        lambda: Steering("resid_post", (), (Additive([1.0]),)),
        lambda: Steering("embeddings", (1,), (Additive([1.0]),)),
        lambda: Steering("attn_probs", (1,), (Additive([1.0]),)),
        lambda: Steering("resid_post", (1,), ()),
        lambda: Steering("resid_post", (1,), (Additive([1.0]), Additive([1.0, 2.0]))),
        lambda: Steering("resid_post", (1,), ("add",)),  # type: ignore[arg-type]
        lambda: PositionMask((-1,)),
    ],
)
def test_bad_specs_are_refused_at_construction(build) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SteeringSpecError):
        build()


def test_width_check_names_both_widths() -> None:
    spec = steer_at("resid_post.2", Additive([1.0, 2.0, 3.0]))
    with pytest.raises(SteeringSpecError, match=r"width 3.*576"):
        spec.check_width(576)


def test_specs_are_hashable_and_accept_tensors() -> None:
    a = Additive(torch.tensor([1.0, 2.0]), 3.0)
    assert a == Additive([1.0, 2.0], 3.0) and hash(a) == hash(Additive((1.0, 2.0), 3.0))


def _h(seed: int = 0) -> torch.Tensor:
    return torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(seed))


def test_additive_adds() -> None:
    h, v = _h(), torch.arange(8.0) + 1
    assert torch.allclose(apply_ops(h, [Additive(v, 2.0)]), h + 2 * v)


def test_orthogonal_zero_removes_the_direction_and_one_is_identity() -> None:
    h, v = _h(), torch.randn(8)
    u = v / v.norm()
    out = apply_ops(h, [Orthogonal(v, 0.0)])
    assert (out @ u).abs().max() < 1e-5
    assert (h @ u).abs().max() > 1e-2  # negative control: the direction was there
    assert torch.allclose(apply_ops(h, [Orthogonal(v, 1.0)]), h)


def test_projection_cap_bounds_the_projection() -> None:
    h, v = _h() * 5, torch.randn(8)
    u = v / v.norm()
    out = apply_ops(h, [ProjectionCap(v, min=-0.5, max=0.5)])
    p = out @ u
    assert p.max() <= 0.5 + 1e-5 and p.min() >= -0.5 - 1e-5
    assert (h @ u).abs().max() > 0.5  # the cap had work to do
    # Orthogonal complement untouched.
    assert torch.allclose(
        out - (out @ u).unsqueeze(-1) * u, h - (h @ u).unsqueeze(-1) * u, atol=1e-5
    )


def test_lens_ops() -> None:
    h, d = _h(), torch.randn(8)
    dn = d / d.norm()
    steered = apply_ops(h, [LensSteer(d, strength=5.0, max_fraction=0.5)])
    delta = steered - h
    assert torch.allclose(delta.norm(dim=-1), 0.5 * h.norm(dim=-1), atol=1e-4)
    assert torch.allclose(delta / delta.norm(dim=-1, keepdim=True), dn.expand_as(delta), atol=1e-5)
    ablated = apply_ops(h, [LensAblate(d)])
    assert (ablated @ dn).abs().max() < 1e-5
    s, t = torch.randn(8), torch.randn(8)
    sn, tn = s / s.norm(), t / t.norm()
    swapped = apply_ops(h, [LensSwap(s, t)])
    assert torch.allclose(swapped, h + (h @ sn).unsqueeze(-1) * (tn - sn), atol=1e-5)


def test_ops_apply_in_order() -> None:
    h, v = _h(), torch.randn(8)
    u = v / v.norm()
    add_then_ablate = apply_ops(h, [Additive(v), Orthogonal(v, 0.0)])
    ablate_then_add = apply_ops(h, [Orthogonal(v, 0.0), Additive(v)])
    assert (add_then_ablate @ u).abs().max() < 1e-5
    assert torch.allclose(ablate_then_add @ u, torch.full((2, 5), float(v.norm())), atol=1e-4)


def test_row_mask_leaves_masked_rows_bit_identical() -> None:
    h = _h()
    rows = torch.ones(2, 5, dtype=torch.bool)
    rows[:, :2] = False
    out = apply_ops(h, [Additive(torch.ones(8))], rows)
    assert torch.equal(out[:, :2], h[:, :2])
    assert not torch.equal(out[:, 2:], h[:, 2:])


def test_bf16_math_runs_in_fp32() -> None:
    h = _h().bfloat16()
    out = apply_ops(h, [Additive(torch.full((8,), 1e-3))])
    assert out.dtype == torch.bfloat16


def test_position_mask_special_tokens() -> None:
    mask = PositionMask((0, 3), special_tokens=True)
    assert mask.masked([1, 5, 2, 7], special_ids={2}) == frozenset({0, 2, 3})
