"""How vllm-static reaches each point: it taps the sites hooked vLLM hooks (a static tap where
hooked vLLM has a hook), recomputes attention maps from tapped q and k, and refuses the rest with
hooked vLLM's reason. Its plugin hands this to ie-core (`BackendPlugin.serving`)."""

from __future__ import annotations

from ie_core.grammar import Point, Service, Serving
from ie_vllm import RECOMPUTE_ATTN, vllm_serving

__all__ = ["static_serving"]

_TAP = Serving(Service.STATIC_TAP)
_RECOMPUTE_ATTN = Serving(
    Service.RECOMPUTE, "recomputed in the worker from tapped post-RoPE q and k"
)
_MULTI_STREAM = Serving(
    Service.NOT_SERVED, "vllm-static does not tap multi-stream trunks yet; use backend='vllm'"
)


def static_serving(point: Point) -> Serving:
    """Backend `vllm-static`, from hooked vLLM's answer for the same point."""
    if point.requires == "multi_stream":
        return _MULTI_STREAM
    hooked = vllm_serving(point)
    if hooked.service is Service.HOOK:
        return _TAP
    return _RECOMPUTE_ATTN if hooked == RECOMPUTE_ATTN else hooked
