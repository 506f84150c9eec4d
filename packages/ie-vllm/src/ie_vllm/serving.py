"""How the vLLM backends are designed to reach each point: a hook on a module of vLLM's forward,
a recompute in the worker, or a refusal where vLLM fuses the tensor away. ie-vllm's plugins hand
these to ie-core (`BackendPlugin.serving`); whether a loaded model serves a point on its family
is still its own answer (`model.capabilities()`).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from ie_core.grammar import Point, Service, Serving

__all__ = ["GENERATE_SERVING", "RECOMPUTE_ATTN", "generate_serving", "vllm_serving"]

HOOK = Serving(Service.HOOK)
RECOMPUTE_ATTN = Serving(
    Service.RECOMPUTE, "recomputed in the worker from captured post-RoPE q and k"
)
_STREAM_COLLAPSE = Serving(
    Service.RECOMPUTE, "recomputed from resid_streams and the collapse weights"
)


def _fused(why: str) -> Serving:
    return Serving(Service.NOT_SERVED, f"unreachable on vLLM: {why}; use backend='eager'")


_GATE_UP = _fused("vLLM fuses gate and up projections into one matmul")
_ROUTING = _fused("routing happens inside the fused MoE kernel")

# Every point not named here is hooked on the module that computes it.
_NOT_HOOKED: Mapping[str, Serving] = MappingProxyType(
    {
        "attn_scores": RECOMPUTE_ATTN,
        "attn_probs": RECOMPUTE_ATTN,
        "attn_gate": _fused("the output gate is computed inside vLLM's fused attention module"),
        "mlp_pre": _GATE_UP,
        "mlp_pre_linear": _GATE_UP,
        "expert_weights": _ROUTING,
        "expert_indices": _ROUTING,
        "lm_head": _fused("vLLM folds the logit scale and softcap into compute_logits"),
        "attn_stream_collapse": _STREAM_COLLAPSE,
        "mlp_stream_collapse": _STREAM_COLLAPSE,
    }
)

GENERATE_SERVING = Serving(
    Service.NOT_SERVED,
    "vllm-generate runs vLLM untouched; load backend='vllm' or 'vllm-static' to capture",
)


def vllm_serving(point: Point) -> Serving:
    """Backend `vllm` (hooked): a hook, a worker recompute, or why vLLM's forward hides it."""
    return _NOT_HOOKED.get(point.name, HOOK)


def generate_serving(point: Point) -> Serving:
    """Backend `vllm-generate` runs no hooks, so it serves no point."""
    return GENERATE_SERVING
