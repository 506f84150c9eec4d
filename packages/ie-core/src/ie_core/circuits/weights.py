"""The weights the frozen linear replacement needs, read from a Hugging Face model: per layer the
two norms' affine parts, the value and output projections; the final norm and the unembed.

Queries and keys are not needed: attention patterns are frozen at the captured values. Families
whose residual path is not `x + attn(norm1(x))` then `x + mlp(norm2(x))` (parallel blocks,
sandwich norms, Gemma's `1 + w` norms and scaled embeddings, multi-stream trunks) are refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ie_core.circuits.errors import ReplacementUnsupportedError

_LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3")
SUPPORTED = (*_LLAMA_LIKE, "gpt2")


@dataclass(frozen=True)
class NormWeights:
    """`(x - mean(x) if centred) * scale * weight + bias`; the scale is frozen per position."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    eps: float
    centred: bool  # LayerNorm subtracts the mean; RMSNorm does not


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer's linear path: `W_V` `[n_kv_heads * head_dim, d_model]` and `W_O`
    `[d_model, n_heads * head_dim]` in `nn.Linear`'s layout."""

    norm1: NormWeights
    W_V: torch.Tensor
    b_V: torch.Tensor | None
    W_O: torch.Tensor
    b_O: torch.Tensor | None
    norm2: NormWeights
    n_heads: int
    n_kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class ReplacementWeights:
    """Everything but the MLPs (transcoders replace them) and the patterns (captured)."""

    layers: tuple[LayerWeights, ...]
    final_norm: NormWeights
    W_U: torch.Tensor  # [vocab, d_model]
    b_U: torch.Tensor | None
    family: str


def _f32(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().to(device="cpu", dtype=torch.float32)


def _t(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(device="cpu", dtype=torch.float32)


def _rms(module: Any) -> NormWeights:
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    if eps is None:
        raise ReplacementUnsupportedError(f"{type(module).__name__} names no epsilon")
    return NormWeights(_t(module.weight), None, float(eps), centred=False)


def _ln(module: Any) -> NormWeights:
    return NormWeights(_t(module.weight), _f32(module.bias), float(module.eps), centred=True)


def _llama_like(hf: Any, cfg: Any) -> ReplacementWeights:
    n_heads = int(cfg.num_attention_heads)
    n_kv = int(getattr(cfg, "num_key_value_heads", None) or n_heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads)
    layers = []
    for block in hf.model.layers:
        attn = block.self_attn
        layers.append(
            LayerWeights(
                _rms(block.input_layernorm),
                _t(attn.v_proj.weight),
                _f32(attn.v_proj.bias),
                _t(attn.o_proj.weight),
                _f32(attn.o_proj.bias),
                _rms(block.post_attention_layernorm),
                n_heads,
                n_kv,
                head_dim,
            )
        )
    head = hf.lm_head
    return ReplacementWeights(
        tuple(layers), _rms(hf.model.norm), _t(head.weight), _f32(head.bias), cfg.model_type
    )


def _gpt2(hf: Any, cfg: Any) -> ReplacementWeights:
    d = int(cfg.n_embd)
    n_heads = int(cfg.n_head)
    layers = []
    for block in hf.transformer.h:
        # Conv1D stores [in, out] (x @ W); the value is the last third of the fused qkv output.
        qkv_w, qkv_b = block.attn.c_attn.weight, block.attn.c_attn.bias
        layers.append(
            LayerWeights(
                _ln(block.ln_1),
                _t(qkv_w[:, 2 * d :].T),
                _t(qkv_b[2 * d :]),
                _t(block.attn.c_proj.weight.T),
                _t(block.attn.c_proj.bias),
                _ln(block.ln_2),
                n_heads,
                n_heads,
                d // n_heads,
            )
        )
    head = hf.lm_head
    return ReplacementWeights(
        tuple(layers), _ln(hf.transformer.ln_f), _t(head.weight), _f32(head.bias), "gpt2"
    )


def weights_of(hf_model: Any) -> ReplacementWeights:
    """The replacement's weights from a loaded HF causal LM (fp32 copies on the CPU)."""
    cfg = hf_model.config
    kind = str(getattr(cfg, "model_type", ""))
    if kind in _LLAMA_LIKE:
        return _llama_like(hf_model, cfg)
    if kind == "gpt2":
        return _gpt2(hf_model, cfg)
    raise ReplacementUnsupportedError(
        f"the frozen linear replacement is built for {', '.join(SUPPORTED)}, not {kind!r} "
        "(its residual path differs: parallel blocks, sandwich or offset norms, scaled "
        "embeddings); trace one of those families"
    )


def hf_model_for(model: Any, weights: Any, what: str) -> Any:
    """The Hugging Face module `what` is read from: an HF folder given as `weights`, or an eager
    model's own (a vLLM backend keeps its weights in its workers)."""
    if weights is not None:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(str(weights), torch_dtype=torch.float32)
    hf = getattr(model, "hf_model", None)
    if hf is None:
        raise ReplacementUnsupportedError(
            f"{what} need the model's weights on this process and the "
            f"{getattr(model, 'backend', type(model).__name__)} backend keeps them in its "
            "workers; pass weights= (the model's Hugging Face folder)"
        )
    return hf


def weights_for(model: Any, weights: Any = None) -> ReplacementWeights:
    """The weights of `model`: given ones, an HF folder's, or an eager model's own."""
    if isinstance(weights, ReplacementWeights):
        return weights
    return weights_of(hf_model_for(model, weights, "the backward passes"))


__all__ = [
    "SUPPORTED",
    "LayerWeights",
    "NormWeights",
    "ReplacementWeights",
    "weights_for",
    "weights_of",
]
