"""Independent references for every steering op: USAGE's op table written out in float64 torch,
one op at a time, without `ie_core.ops.apply`. Imported by ie-core's and ie-eager's tests, so a
bug in the shared math cannot hide behind two backends that both call it.

Patch and Scale have their own row-by-row reference in test_interventions.py."""

from __future__ import annotations

import torch
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

__all__ = ["reference", "reference_ops", "sae_clamp_reference"]


def _vec(values: object) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def _unit(values: object) -> torch.Tensor:
    v = _vec(values)
    return v / v.norm()


def _along(h: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """h . u per row, as [..., 1]."""
    return (h * u).sum(-1, keepdim=True)


def _lens_steer(h: torch.Tensor, op: LensSteer) -> torch.Tensor:
    """delta = strength |h| d^, then rescaled (same direction) so |delta| <= max_fraction |h|."""
    norm = h.norm(dim=-1, keepdim=True)
    delta = op.strength * norm * _unit(op.direction)
    size = delta.norm(dim=-1, keepdim=True)
    cap = op.max_fraction * norm
    factor = torch.where(size > cap, cap / size.clamp_min(1e-300), torch.ones_like(size))
    return h + delta * factor


def reference(h: torch.Tensor, op: SteeringOp) -> torch.Tensor:
    """One op on rows `h` ([..., width]) in float64, straight from its definition."""
    h = h.double()
    if isinstance(op, Additive):
        return h + op.coeff * _vec(op.vector)
    if isinstance(op, Orthogonal):
        u = _unit(op.vector)
        return h + (op.coeff - 1.0) * _along(h, u) * u
    if isinstance(op, ProjectionCap):
        u = _unit(op.vector)
        p = _along(h, u)
        lo = -torch.inf if op.min is None else op.min
        hi = torch.inf if op.max is None else op.max
        return h + (torch.clamp(p, lo, hi) - p) * u
    if isinstance(op, LensSteer):
        return _lens_steer(h, op)
    if isinstance(op, LensAblate):
        d = _unit(op.direction)
        return h - _along(h, d) * d
    if isinstance(op, LensSwap):
        s, t = _unit(op.source), _unit(op.target)
        return h + _along(h, s) * (t - s)
    if isinstance(op, FeatureClamp):
        p = h @ _vec(op.encoder) + op.bias
        act = torch.where(p > max(op.threshold, 0.0), p, torch.zeros_like(p))
        return h + (op.value - act).unsqueeze(-1) * _vec(op.decoder)
    raise TypeError(f"no reference for {op!r}")


def reference_ops(h: torch.Tensor, ops: tuple[SteeringOp, ...]) -> torch.Tensor:
    for op in ops:
        h = reference(h, op)
    return h


def sae_clamp_reference(
    h: torch.Tensor,
    weights: dict[str, torch.Tensor],
    feature: int,
    value: float,
    *,
    jumprelu: bool = False,
    b_dec_in: bool = False,
) -> torch.Tensor:
    """The whole dictionary, not one column: decode(acts with `feature` set to `value`) plus the
    reconstruction error h - decode(acts), as the feature-clamp definition in USAGE says."""
    h = h.double()
    w = {k: v.double() for k, v in weights.items()}
    x = h - w["b_dec"] if b_dec_in else h
    pre = x @ w["W_enc"] + w["b_enc"]
    acts = torch.relu(pre)
    if jumprelu:
        acts = acts * (pre > w["threshold"])
    clamped = acts.clone()
    clamped[..., feature] = value
    decode = lambda a: a @ w["W_dec"] + w["b_dec"]  # noqa: E731
    return decode(clamped) + (h - decode(acts))
