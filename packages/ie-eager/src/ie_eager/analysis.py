"""Eager-only inputs for ie_core.experiments.analysis: the attention output projection's weight and bias."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch
from ie_core.errors import PointUnavailableError

from ie_eager import structure as st

if TYPE_CHECKING:
    from ie_eager.backend import EagerModel


def out_projection(model: EagerModel, layer: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Layer `layer`'s o_proj as (weight `[d_model, n_heads * head_dim]`, bias or None), the
    layout `ie_core.experiments.analysis.head_contributions` takes (GPT-2's Conv1D weight is transposed)."""
    block = model.structure.blocks[layer]
    found = block.sub(block.attn, st.O_PROJ_NAMES)
    if found is None:
        raise PointUnavailableError(f"layer {layer} of {model.model_id} has no output projection")
    name, module = found
    if name.endswith("o_a_proj") or block.attn_adds_residual:
        raise PointUnavailableError(
            f"layer {layer} of {model.model_id}: attn_out is not one projection of z here "
            "(grouped output projection, or attention that adds the residual itself), so "
            "per-head contributions do not sum to it"
        )
    weight = cast(torch.Tensor, module.weight).detach()
    if hasattr(module, "nf"):  # transformers' Conv1D stores [in, out]
        weight = weight.T
    bias = cast(torch.Tensor | None, getattr(module, "bias", None))
    return weight, None if bias is None else bias.detach()


__all__ = ["out_projection"]
