"""interp-engine static taps: capture and steering that survive torch.compile and CUDA graphs on vLLM.

The backend is `ie_static.backend.load` (entry point `vllm-static`); the taps are in `ie_static.ops`.
"""

from importlib.metadata import version

__version__ = version("ie-static")  # one source: the installed distribution's metadata

__all__ = ["__version__"]
