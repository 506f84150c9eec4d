"""`apply_ops` against the float64 references of op_references.py (USAGE's table written out),
with cases below and above every cap, and a negative control wherever a plausible wrong
implementation (a cap always applied, a bound ignored, a feature clamped on the wrong row) would
give the same number on easier data.

Tolerance: 1e-5 relative to the rows' scale (fp32 math against a float64 reference)."""

from __future__ import annotations

import pytest
import torch
from ie_core.experiments.features import feature_ablate, feature_clamp, feature_steer
from ie_core.experiments.saes import from_tensors
from ie_core.ops import (
    Additive,
    FeatureClamp,
    LensAblate,
    LensSteer,
    LensSwap,
    Orthogonal,
    ProjectionCap,
    SteeringOp,
)
from ie_core.ops.apply import apply_ops
from op_references import reference, reference_ops, sae_clamp_reference

W = 16


def _rows(seed: int = 0, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(3, 7, W, generator=torch.Generator().manual_seed(seed)) * scale


def _dir(seed: int) -> torch.Tensor:
    return torch.randn(W, generator=torch.Generator().manual_seed(100 + seed))


def assert_matches(got: torch.Tensor, want: torch.Tensor) -> None:
    scale = float(want.abs().max())
    err = float((got.double() - want).abs().max())
    assert err <= 1e-5 * max(scale, 1.0), f"max abs error {err:g} at scale {scale:g}"


CASES: dict[str, SteeringOp] = {
    "additive": Additive(_dir(0), coeff=2.5),
    "additive_negative": Additive(_dir(1), coeff=-0.7),
    "orthogonal_ablate": Orthogonal(_dir(2), coeff=0.0),
    "orthogonal_double": Orthogonal(_dir(2), coeff=2.0),
    "orthogonal_flip": Orthogonal(_dir(3), coeff=-1.0),
    "cap_both": ProjectionCap(_dir(4), min=-1.0, max=1.5),
    "cap_max_only": ProjectionCap(_dir(5), max=0.5),
    "cap_min_only": ProjectionCap(_dir(6), min=-0.5),
    "lens_steer_below_cap": LensSteer(_dir(7), strength=0.3, max_fraction=0.8),
    "lens_steer_negative_below_cap": LensSteer(_dir(7), strength=-0.25, max_fraction=0.5),
    "lens_steer_at_cap": LensSteer(_dir(8), strength=0.5, max_fraction=0.5),
    "lens_steer_above_cap": LensSteer(_dir(8), strength=4.0, max_fraction=0.5),
    "lens_steer_negative_above_cap": LensSteer(_dir(9), strength=-3.0, max_fraction=0.25),
    "lens_ablate": LensAblate(_dir(10)),
    "lens_swap": LensSwap(_dir(11), _dir(12)),
    "feature_clamp_raw": FeatureClamp(_dir(13), _dir(14), bias=0.2, threshold=0.5, value=3.0),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_op_equals_its_definition(name: str) -> None:
    op, h = CASES[name], _rows()
    got = apply_ops(h, [op])
    assert_matches(got, reference(h, op))
    assert not torch.allclose(got, h, atol=1e-3)  # negative control: the op moved the rows


@pytest.mark.parametrize("strength", [0.05, 0.3, -0.4, 0.79])
def test_lens_steer_below_its_cap_scales_with_strength(strength: float) -> None:
    """The step is strength * |h| exactly while it is under the cap: an implementation that
    always steps by max_fraction (or ignores the sign) fails here."""
    h, d = _rows(1), _dir(20)
    got = apply_ops(h, [LensSteer(d, strength=strength, max_fraction=0.8)]).double()
    step = (got - h.double()).norm(dim=-1) / h.double().norm(dim=-1)
    assert torch.allclose(step, torch.full_like(step, abs(strength)), atol=1e-5)
    along = ((got - h.double()) @ (d.double() / d.double().norm())).sign()
    assert bool((along == (1.0 if strength > 0 else -1.0)).all())


def test_lens_steer_above_its_cap_stops_at_the_cap() -> None:
    h, d = _rows(2), _dir(21)
    got = apply_ops(h, [LensSteer(d, strength=-5.0, max_fraction=0.3)]).double()
    step = (got - h.double()).norm(dim=-1) / h.double().norm(dim=-1)
    assert torch.allclose(step, torch.full_like(step, 0.3), atol=1e-5)


def _cap_case(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows whose projections on u span [-4, 4]: some below, inside and above every bound."""
    u = _dir(seed) / _dir(seed).norm()
    base = _rows(seed, 1.0)
    base = base - (base @ u).unsqueeze(-1) * u
    p = torch.linspace(-4.0, 4.0, base.shape[0] * base.shape[1]).view(base.shape[:-1])
    return base + p.unsqueeze(-1) * u, u


@pytest.mark.parametrize(("lo", "hi"), [(-1.0, 2.0), (None, 0.5), (-0.5, None), (1.0, 1.0)])
def test_projection_cap_below_inside_and_above(lo: float | None, hi: float | None) -> None:
    h, u = _cap_case(30)
    op = ProjectionCap(u * 7.0, min=lo, max=hi)  # a non-unit vector: the cap is on h . u
    got = apply_ops(h, [op])
    assert_matches(got, reference(h, op))
    p = h @ u
    inside = torch.ones_like(p, dtype=torch.bool)
    if lo is not None:
        inside &= p >= lo
        assert bool((p < lo).any())  # some rows below the lower bound
    if hi is not None:
        inside &= p <= hi
        assert bool((p > hi).any())
    assert bool(inside.any()) or lo == hi
    # Rows inside the bounds are left alone (to rounding): a cap that always moves them fails.
    assert torch.allclose(got[inside], h[inside], atol=1e-5)


def test_ops_compose_in_order_against_the_reference() -> None:
    ops = (
        Additive(_dir(40), 1.5),
        ProjectionCap(_dir(41), min=-0.2, max=0.2),
        LensSteer(_dir(42), strength=0.2, max_fraction=0.6),
        LensSwap(_dir(43), _dir(44)),
        Orthogonal(_dir(45), 0.5),
    )
    h = _rows(3)
    assert_matches(apply_ops(h, list(ops)), reference_ops(h, ops))
    # Negative control: the reverse order gives another answer.
    assert not torch.allclose(reference_ops(h, ops), reference_ops(h, ops[::-1]), atol=1e-3)


def _dictionary(seed: int, jumprelu: bool = False) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    width = 32
    w = {
        "W_enc": torch.randn(W, width, generator=g) / W**0.5,
        "b_enc": torch.randn(width, generator=g) * 0.3,
        "W_dec": torch.randn(width, W, generator=g) / width**0.5,
        "b_dec": torch.randn(W, generator=g) * 0.5,
    }
    if jumprelu:
        w["threshold"] = torch.rand(width, generator=g) * 1.5
    return w


@pytest.mark.parametrize(
    ("activation", "b_dec_in", "value"),
    [("relu", False, 4.0), ("relu", True, 0.0), ("jumprelu", False, 2.5), ("jumprelu", True, 0.0)],
)
def test_feature_clamp_equals_the_whole_dictionary_with_one_feature_set(
    activation: str, b_dec_in: bool, value: float
) -> None:
    jump = activation == "jumprelu"
    w = _dictionary(50 + int(b_dec_in), jumprelu=jump)
    sae = from_tensors(w, address="resid_post.0", activation=activation, b_dec_in=b_dec_in)
    h = _rows(4, 1.0)
    x = h - w["b_dec"] if b_dec_in else h
    pre = x @ w["W_enc"] + w["b_enc"]
    live = torch.relu(pre) * (pre > w["threshold"]) if jump else torch.relu(pre)
    # The feature with active and inactive rows (JumpReLU: some pre > 0 but under the threshold).
    counts = (live > 0).sum((0, 1))
    feature = int((counts - h.shape[0] * h.shape[1] / 2).abs().argmin())
    assert 0 < int(counts[feature]) < h.shape[0] * h.shape[1]
    if jump:
        under = (pre[..., feature] > 0) & (pre[..., feature] <= w["threshold"][feature])
        assert bool(under.any()) or bool((pre[..., feature] <= 0).any())
    op = feature_clamp(sae, feature, value) if value else feature_ablate(sae, feature)
    want = sae_clamp_reference(h, w, feature, value, jumprelu=jump, b_dec_in=b_dec_in)
    assert_matches(apply_ops(h, [op]), want)
    # Negative control: clamping a neighbouring feature is another answer.
    other = sae_clamp_reference(h, w, (feature + 1) % 32, value, jumprelu=jump, b_dec_in=b_dec_in)
    assert not torch.allclose(want, other, atol=1e-3)


def test_feature_steer_adds_the_decoder_row() -> None:
    w = _dictionary(60)
    sae = from_tensors(w, address="resid_post.0")
    h = _rows(5)
    got = apply_ops(h, [feature_steer(sae, 7, -3.0)])
    assert_matches(got, h.double() - 3.0 * w["W_dec"][7].double())
    assert not torch.allclose(got, h + 3.0 * w["W_dec"][7], atol=1e-3)
