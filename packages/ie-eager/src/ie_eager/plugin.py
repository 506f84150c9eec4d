"""ie-eager's `ie.backends` descriptor; importing it does not import torch."""

from __future__ import annotations

from typing import Any

from ie_core.backend_plugin import BackendPlugin
from ie_core.grammar import Point, Service, Serving


def _load(model_id: Any, **kw: Any) -> Any:
    from ie_eager.backend import load

    return load(model_id, **kw)


def _serving(point: Point) -> Serving:
    """Eager hooks the HF module that computes every point (or refuses per family at load)."""
    return Serving(Service.HOOK)


def _memory(shape: Any, work: Any) -> Any:
    from ie_eager.memory_prices import eager_memory

    return eager_memory(shape, work)


# One forward per harvest batch, unpadded and without a scheduler: small batches bound memory.
EAGER = BackendPlugin("eager", "ie-eager", _load, harvest_batch=8, serving=_serving, memory=_memory)

__all__ = ["EAGER"]
