"""The `vllm-static` entry point: check that a vLLM engine is installed (ie-vllm's extras), then load."""

from __future__ import annotations

from typing import Any

from ie_vllm import require_engine


def load(model_id: Any, **kw: Any) -> Any:
    """Entry point `vllm-static`."""
    require_engine("vllm-static")
    from ie_static.backend import load as load_static

    return load_static(model_id, **kw)


__all__ = ["load"]
