"""The worker's raw weights for `model.W_Q`, `model.W_U`, ... (`ie_core.tl_weights`): each part
in torch's layout, cut out of vLLM's fused modules by their own sizes.

vLLM fuses q, k and v into `qkv_proj` (`num_heads`, `num_kv_heads`, `head_size` rows each) and
gate and up into `gate_up_proj` (`output_sizes`, gate first), and pads the vocabulary of its
embedding and LM head (`org_vocab_size` rows are the model's). Found by module name on the layers
this pipeline stage holds; a layout other than these (no `qkv_proj`, say) is refused by name,
and so is a linear weight vLLM's CPU platform packed away at load (below).
The host refuses every part under tensor parallelism before asking (each rank holds a shard).
"""

from __future__ import annotations

import re
from typing import Any

import torch

__all__ = ["weight_parts"]

_LAYER = re.compile(
    r"(?:^|\.)layers\.(\d+)\.(self_attn|mlp)\.(qkv_proj|o_proj|gate_up_proj|down_proj)$"
)
_MODULE_OF = {
    "q": "qkv_proj", "k": "qkv_proj", "v": "qkv_proj", "o": "o_proj",
    "gate": "gate_up_proj", "up": "gate_up_proj", "down": "down_proj",
}  # fmt: skip


# vLLM's CPU platform hands each linear layer's weight to oneDNN (or its sgl kernel) at load, in
# their packed layout, and frees the plain tensor (`dispatch_cpu_unquantized_gemm`,
# remove_weight=True); embedding and LM head keep theirs.
_PACKED = (
    "vLLM's CPU backend packs the linear layers' weights into its GEMM kernel's layout at load and "
    "frees the plain tensors, so {part} cannot be read on this engine; read it on backend='eager' "
    "(the same checkpoint) or on a GPU vLLM, which keeps them (W_E, W_U and b_U are read here)"
)


def weight_parts(model: torch.nn.Module, part: str) -> dict[str, Any]:
    """`{"tensors": {name: tensor}, "absent": [names], "refused": why or ""}`: a whole-model part
    under its own name, a per-layer part as `part.L` for each layer this stage holds."""
    tensors: dict[str, torch.Tensor] = {}
    absent: list[str] = []
    base, _, bias = part.partition("_")
    attr = "bias" if bias else "weight"
    if part in ("embed", "unembed", "unembed_bias", "pos_embed"):
        name = {"embed": "embed_tokens", "unembed": "lm_head", "unembed_bias": "lm_head"}.get(part)
        module = _named(model, name) if name else None
        value = None if module is None else _vocab_rows(module, attr)
        if value is None:
            absent.append(part)
        else:
            tensors[part] = value
        return {"tensors": tensors, "absent": absent, "refused": ""}
    if base not in _MODULE_OF:
        return {"tensors": {}, "absent": [], "refused": f"{part!r} is not a weight part"}
    found = False
    for name, module in model.named_modules():
        match = _LAYER.search(name)
        if match is None or match.group(3) != _MODULE_OF[base]:
            continue
        found = True
        key = f"{part}.{int(match.group(1))}"
        value = getattr(module, attr, None)
        if value is None:
            absent.append(key)
        elif value.numel() == 0:
            return {"tensors": {}, "absent": [], "refused": _PACKED.format(part=part)}
        else:
            tensors[key] = _slice(module, base, value.detach())
    if not found:
        why = f"no layers.N.*.{_MODULE_OF[base]} module in this vLLM model, so {part} is not read"
        return {"tensors": {}, "absent": [], "refused": why}
    return {"tensors": tensors, "absent": absent, "refused": ""}


def _named(model: torch.nn.Module, suffix: str) -> torch.nn.Module | None:
    for name, module in model.named_modules():
        if name == suffix or name.endswith(f".{suffix}"):
            return module
    return None


def _vocab_rows(module: Any, attr: str) -> torch.Tensor | None:
    value = getattr(module, attr, None)
    if not isinstance(value, torch.Tensor):
        return None
    rows = int(getattr(module, "org_vocab_size", value.shape[0]))
    return value.detach()[:rows]


def _slice(module: Any, base: str, value: torch.Tensor) -> torch.Tensor:
    """q, k or v out of `qkv_proj`; gate or up out of `gate_up_proj`; the rest whole."""
    if base in ("q", "k", "v"):
        q = int(module.num_heads) * int(module.head_size)
        kv = int(module.num_kv_heads) * int(module.head_size)
        start, size = {"q": (0, q), "k": (q, kv), "v": (q + kv, kv)}[base]
        return value[start : start + size]
    if base in ("gate", "up"):
        gate = int(module.output_sizes[0])
        return value[:gate] if base == "gate" else value[gate:]
    return value
