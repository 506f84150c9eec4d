"""Running ops on a backend's rows (imports torch; `import ie_core` does not import this module).

Each op owns its maths (`Op.apply`, `Op.delta`); this module runs a site's ops in order in fp32,
casts back, and refuses ops whose values the activations' dtype cannot hold."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ie_core.errors import SteeringSpecError
from ie_core.ops.base import Op
from ie_core.ops.values import VectorLike
from ie_core.ops.vectors import unit


def unit_vector(values: VectorLike, device: torch.device | str = "cpu") -> torch.Tensor:
    """values / |values| in fp32 on `device`: the normalisation every op and table uses."""
    return unit(values, torch.zeros((), dtype=torch.float32, device=device))


def check_ops_fit(ops: Sequence[Op], dtype: torch.dtype, where: str) -> None:
    """Refuse ops whose own values do not fit the activations' dtype (the result is cast back to
    it): an additive delta or a projection bound beyond its max would write inf there."""
    if not dtype.is_floating_point:
        return
    limit = torch.finfo(dtype).max
    for op in ops:
        peak = op.peak()
        if peak is not None and peak[0] > limit:
            raise SteeringSpecError(
                f"{where}: {peak[1]}, beyond the {dtype} max {limit:g} of this model's "
                "activations, so the steered value would be inf; use a smaller value or load the "
                "model in float32"
            )


def apply_ops(
    h: torch.Tensor,
    ops: Sequence[Op],
    rows: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """Apply `ops` in order to `h` ([..., width]); `rows` (bool, h.shape[:-1]) selects what is steered.

    `positions` (int, h.shape[:-1]) are the rows' absolute sequence positions, which a `Patch` at
    given positions needs. Returns a new tensor; unselected rows are bit-identical to the input.
    """
    x = h.float()
    for op in ops:
        x = op.apply(x, positions)
    out = x.to(h.dtype)
    if rows is None:
        return out
    return torch.where(rows.unsqueeze(-1), out, h)


__all__ = ["apply_ops", "check_ops_fit", "unit_vector"]
