"""What a streamed read-out (`stream_lens`, `stream_features`) checks before it starts: a
positive `k`, and a backend that serves the stream (only some reduce rows as they are made)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ie_core.active_steering import with_active
from ie_core.errors import UnsupportedOperationError
from ie_core.protocol import SteeringArg
from ie_core.sync import unwrap

__all__ = ["open_stream"]


def open_stream(
    model: Any, steering: SteeringArg, k: int, method: str, refusal: str
) -> tuple[Any, SteeringArg, Callable[..., Any]]:
    """(backend, steering with the model's active one, its `method`); `refusal` completes
    "<backend> has no ..." where the backend lacks `method`."""
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    model, steering = unwrap(model), with_active(model, steering)
    stream = getattr(model, method, None)
    if stream is None:
        raise UnsupportedOperationError(f"{type(model).__name__} has no {refusal}")
    return model, steering, stream
