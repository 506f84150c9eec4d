"""Eager's raw weights for `ie_core.tl_weights` (`model.W_Q`, `model.W_U`, ...): each part in
torch's layout, read off the HF modules `ie_eager.structure` found.

A fused projection (GPT-2's `c_attn`, Phi-3's `qkv_proj` / `gate_up_proj`) is refused by name
rather than split by a guess at its layout; so is a block without the module (a linear-attention
layer has no `q`).
"""

from __future__ import annotations

from typing import Any, Protocol, cast

import torch
from ie_core.errors import UnsupportedOperationError
from torch import nn

from ie_eager import structure as st

__all__ = ["weight_parts"]


class Loaded(Protocol):
    """What the weights are read off: the loaded model's structure, HF module and name."""

    structure: st.Structure
    model_id: str

    @property
    def hf_model(self) -> nn.Module: ...


_ATTN = {"q": st.Q_PROJ_NAMES, "k": st.K_PROJ_NAMES, "v": st.V_PROJ_NAMES, "o": st.O_PROJ_NAMES}
_MLP = {"gate": st.GATE_NAMES, "up": st.UP_NAMES + st.PLAIN_IN_NAMES, "down": st.DOWN_NAMES}


def weight_parts(model: Loaded, part: str) -> Any:
    """`part` (see `ie_core.tl_weights.PARTS`): a tensor, one per layer, or None where absent."""
    s = model.structure
    if part == "embed":
        return _param(s.embed[1], "weight")
    if part == "unembed":
        return _param(s.lm_head[1], "weight")
    if part == "unembed_bias":
        return _param(s.lm_head[1], "bias")
    if part == "pos_embed":
        found = getattr(model.hf_model, "transformer", None)
        wpe = getattr(found, "wpe", None)  # GPT-2's learned positions; others have none here
        return None if wpe is None else _param(wpe, "weight")
    base, _, bias = part.partition("_")
    table = _ATTN if base in _ATTN else _MLP if base in _MLP else None
    if table is None:
        raise UnsupportedOperationError(f"{part!r} is not a weight part")
    return [
        _layer_part(model, block, base, table, "bias" if bias else "weight") for block in s.blocks
    ]


def _layer_part(
    model: Loaded, block: st.Block, base: str, table: dict[str, tuple[str, ...]], attr: str
) -> torch.Tensor | None:
    owner = block.attn if table is _ATTN else block.mlp
    found = block.sub(owner, table[base])
    if found is None or (base == "up" and found[0].endswith("c_proj")):
        raise UnsupportedOperationError(
            f"layer {block.index} of {model.model_id} has no separate {base} projection (a fused "
            "or absent module), so its TransformerLens-shaped weight is not given here"
        )
    module = found[1]
    if hasattr(module, "nf"):  # transformers' Conv1D stores [in, out]: refused, as fused above
        raise UnsupportedOperationError(
            f"{found[0]} of {model.model_id} is a Conv1D (GPT-2 layout); read its weight directly"
        )
    return _param(module, attr)


def _param(module: Any, attr: str) -> torch.Tensor | None:
    value = cast(torch.Tensor | None, getattr(module, attr, None))
    return None if value is None else value.detach()
