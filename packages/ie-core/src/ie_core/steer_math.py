"""The steering math, shared by every backend (imports torch; ie_core does not import this module
at load). Each op adds a delta computed in fp32 and the result is cast back to h's dtype."""

from __future__ import annotations

from collections.abc import Sequence

import torch

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


def _unit(values: VectorLike, device: torch.device) -> torch.Tensor:
    v = torch.tensor(values, dtype=torch.float32, device=device)
    return v / v.norm()


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
        d = _unit(op.direction, dev)
        norm = h.norm(dim=-1, keepdim=True)
        delta = op.strength * norm * d
        limit = op.max_fraction * norm
        dnorm = delta.norm(dim=-1, keepdim=True)
        scale = torch.where(dnorm > limit, limit / dnorm.clamp_min(1e-30), torch.ones_like(dnorm))
        return delta * scale
    if isinstance(op, LensAblate):
        d = _unit(op.direction, dev)
        return -(h @ d).unsqueeze(-1) * d
    if isinstance(op, LensSwap):
        s = _unit(op.source, dev)
        t = _unit(op.target, dev)
        return (h @ s).unsqueeze(-1) * (t - s)
    raise TypeError(f"unknown steering op {op!r}")


def apply_ops(
    h: torch.Tensor, ops: Sequence[SteeringOp], rows: torch.Tensor | None = None
) -> torch.Tensor:
    """Apply `ops` in order to `h` ([..., width]); `rows` (bool, h.shape[:-1]) selects what is steered.

    Returns a new tensor; unselected rows are bit-identical to the input.
    """
    x = h.float()
    for op in ops:
        x = x + op_delta(x, op)
    out = x.to(h.dtype)
    if rows is None:
        return out
    return torch.where(rows.unsqueeze(-1), out, h)
