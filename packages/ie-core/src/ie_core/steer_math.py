"""The steering math, shared by every backend (imports torch; ie_core does not import this module
at load). Each op adds a delta computed in fp32 and the result is cast back to h's dtype."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import cast

import torch

from ie_core.errors import SteeringSpecError
from ie_core.feature_ops import FeatureClamp
from ie_core.interventions import Hook, Patch, Scale
from ie_core.steering import (
    Additive,
    LensAblate,
    LensSteer,
    LensSwap,
    Orthogonal,
    ProjectionCap,
    SteeringOp,
    VectorLike,
)


def unit_vector(values: VectorLike, device: torch.device | str = "cpu") -> torch.Tensor:
    """values / |values| in fp32, for any vector a spec accepts (finite, non-zero in fp32).

    The vector is first scaled by a power of two that brings its largest entry near 1: exact in
    binary floating point, so normal-range vectors give bit for bit `v / v.norm()`, while tiny or
    huge ones no longer under- or overflow in the squares of the norm (which gave NaN or zero)."""
    v = torch.tensor(values, dtype=torch.float32, device=device)
    peak = float(v.abs().max())
    if peak > 0:
        # In float64, since 2**-exponent of a subnormal fp32 peak is beyond fp32's range.
        v = (v.double() * 2.0 ** -math.frexp(peak)[1]).float()
    return v / v.norm()


_unit = unit_vector


def row_norm(h: torch.Tensor) -> torch.Tensor:
    """|h| per row ([..., 1]), scaled by a power of two per row like `unit_vector`, so a row whose
    entries are finite but near fp32's top (1.8e19 squared overflows) gets a finite norm."""
    _, exponent = torch.frexp(h.abs().amax(dim=-1, keepdim=True))
    return torch.ldexp(torch.ldexp(h, -exponent).norm(dim=-1, keepdim=True), exponent)


def op_delta(h: torch.Tensor, op: SteeringOp) -> torch.Tensor:
    """The fp32 delta of one op for rows `h` ([..., width], fp32)."""
    dev = h.device
    if isinstance(op, Additive):
        v = torch.tensor(op.vector, dtype=torch.float32, device=dev)
        return (op.coeff * v).expand_as(h)
    if isinstance(op, Orthogonal):
        u = _unit(op.vector, dev)
        return (op.coeff - 1.0) * (h @ u).unsqueeze(-1) * u
    if isinstance(op, ProjectionCap):
        u = _unit(op.vector, dev)
        p = h @ u
        return (p.clamp(min=op.min, max=op.max) - p).unsqueeze(-1) * u
    if isinstance(op, LensSteer):
        # |strength * |h| * d| = |strength| * |h| (d is a unit vector), so the rescale to
        # max_fraction * |h| is a clamp of the strength; clamping first cannot overflow to inf*0.
        d = _unit(op.direction, dev)
        strength = max(-op.max_fraction, min(op.max_fraction, op.strength))
        return strength * row_norm(h) * d
    if isinstance(op, LensAblate):
        d = _unit(op.direction, dev)
        return -(h @ d).unsqueeze(-1) * d
    if isinstance(op, LensSwap):
        s = _unit(op.source, dev)
        t = _unit(op.target, dev)
        return (h @ s).unsqueeze(-1) * (t - s)
    if isinstance(op, FeatureClamp):
        return _clamp_delta(h, op)
    raise TypeError(f"unknown steering op {op!r}")


def _clamp_delta(h: torch.Tensor, op: FeatureClamp) -> torch.Tensor:
    """The clamp's delta, computed in float64: `h . encoder` of a huge row by a large encoder can
    pass float32's max even where the delta the op's range check admits does not (feature_ops)."""
    f64 = torch.float64
    p = h.to(f64) @ torch.tensor(op.encoder, dtype=f64, device=h.device) + op.bias
    act = torch.relu(p) * (p > op.threshold)
    delta = (op.value - act).unsqueeze(-1) * torch.tensor(op.decoder, dtype=f64, device=h.device)
    return delta.float()


def check_ops_fit(ops: Sequence[SteeringOp], dtype: torch.dtype, where: str) -> None:
    """Refuse ops whose own values do not fit the activations' dtype (the result is cast back to
    it): an additive delta or a projection bound beyond its max would write inf there."""
    if not dtype.is_floating_point:
        return
    limit = torch.finfo(dtype).max
    for op in ops:
        if isinstance(op, Additive):
            peak = abs(op.coeff) * max(abs(x) for x in cast("tuple[float, ...]", op.vector))
            what = f"additive delta reaches {peak:g}"
        elif isinstance(op, ProjectionCap):
            peak = max(abs(b) for b in (op.min, op.max) if b is not None)
            what = f"projection bound {peak:g}"
        elif isinstance(op, Patch):
            peak = max(abs(x) for row in op.values for x in row)
            what = f"patch value {peak:g}"
        elif isinstance(op, FeatureClamp):
            peak = abs(op.value) * max(abs(x) for x in op.vector)
            what = f"feature clamp value * decoder reaches {peak:g}"
        else:
            continue
        if peak > limit:
            raise SteeringSpecError(
                f"{where}: {what}, beyond the {dtype} max {limit:g} of this model's activations, "
                "so the steered value would be inf; use a smaller value or load the model in "
                "float32"
            )


def head_columns(op: Patch | Scale, width: int, device: torch.device) -> torch.Tensor | None:
    """Bool `[width]`: the columns of `op.heads` (None when the op targets every column)."""
    if not op.heads or op.head_dim is None:
        return None
    cols = torch.zeros(width, dtype=torch.bool, device=device)
    for h in op.heads:
        cols[h * op.head_dim : (h + 1) * op.head_dim] = True
    return cols


def patch_rows(
    op: Patch, positions: torch.Tensor | None, x: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(values `[..., width]` fp32, hit `[...]` bool): the row each position gets, and where."""
    values = torch.tensor(op.values, dtype=torch.float32, device=x.device)
    if op.positions is None:
        return values[0].expand_as(x), torch.ones(x.shape[:-1], dtype=torch.bool, device=x.device)
    if positions is None:
        raise RuntimeError("a Patch at given positions needs the rows' positions")
    wanted = torch.tensor(op.positions, dtype=torch.long, device=x.device)
    match = positions.to(x.device).long().unsqueeze(-1) == wanted  # [..., m]
    index = match.int().argmax(-1) if values.shape[0] > 1 else torch.zeros_like(positions).long()
    return values[index.to(x.device)], match.any(-1)


def apply_op(x: torch.Tensor, op: SteeringOp, positions: torch.Tensor | None) -> torch.Tensor:
    """One op on fp32 rows `x`: a replacement for `Patch` / `Scale`, else `x + op_delta`."""
    if isinstance(op, Scale):
        cols = head_columns(op, x.shape[-1], x.device)
        return x * op.factor if cols is None else torch.where(cols, x * op.factor, x)
    if isinstance(op, Hook):
        return _run_hook(op, x)
    if isinstance(op, Patch):
        values, hit = patch_rows(op, positions, x)
        cols = head_columns(op, x.shape[-1], x.device)
        where = hit.unsqueeze(-1) if cols is None else hit.unsqueeze(-1) & cols
        return torch.where(where, values, x)
    return x + op_delta(x, op)


def _run_hook(op: Hook, x: torch.Tensor) -> torch.Tensor:
    out = op.fn(x, op.address)
    if out is None:
        return x
    if not isinstance(out, torch.Tensor) or out.shape != x.shape:
        shape = getattr(out, "shape", type(out).__name__)
        raise SteeringSpecError(
            f"the hook at {op.address} returned {shape}; return None or a tensor shaped like its "
            f"input {tuple(x.shape)}"
        )
    return out.float()


def apply_ops(
    h: torch.Tensor,
    ops: Sequence[SteeringOp],
    rows: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """Apply `ops` in order to `h` ([..., width]); `rows` (bool, h.shape[:-1]) selects what is steered.

    `positions` (int, h.shape[:-1]) are the rows' absolute sequence positions, which a `Patch` at
    given positions needs. Returns a new tensor; unselected rows are bit-identical to the input.
    """
    x = h.float()
    for op in ops:
        x = apply_op(x, op, positions)
    out = x.to(h.dtype)
    if rows is None:
        return out
    return torch.where(rows.unsqueeze(-1), out, h)
