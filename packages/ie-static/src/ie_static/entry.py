"""The `vllm-static` entry point: check that a vLLM engine is installed (ie-vllm's extras), then load."""

from __future__ import annotations

from typing import Any

from ie_core.backend_plugin import BackendPlugin
from ie_vllm import SWEEP_MAX_MODEL_LEN, VLLM_STACK, require_engine

from ie_static.serving import static_serving


def load(model_id: Any, **kw: Any) -> Any:
    """Entry point `vllm-static`."""
    require_engine("vllm-static")
    from ie_static.backend import load as load_static

    return load_static(model_id, **kw)


# The sweep declares every tappable point at every layer (writes at every writable one), so its
# answer is what the backend can tap, not one declared subset.
_SWEEP = {"static_points": "all", "static_writes": "auto", "max_model_len": SWEEP_MAX_MODEL_LEN}


def _memory(shape: Any, work: Any) -> Any:
    from ie_static.memory import static_memory

    return static_memory(shape, work)


STATIC = BackendPlugin(
    "vllm-static", "ie-static", load, _SWEEP, VLLM_STACK, serving=static_serving, memory=_memory
)

__all__ = ["STATIC", "load"]
