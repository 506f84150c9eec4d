"""interp-engine's eager backend: every point on Hugging Face transformers models through hooks on
their real modules, plus the synthetic families and SmolLM2 offline (see `synthetic`, `smollm2`).

`load(model_id, device=..., dtype=...)` returns an `EagerModel` speaking `ie_core.InterpModel`."""

from importlib.metadata import version

from ie_eager.backend import EagerModel, load

__version__ = version("ie-eager")  # one source: the installed distribution's metadata

__all__ = ["EagerModel", "__version__", "load"]
