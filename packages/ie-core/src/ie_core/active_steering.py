"""Steering active for a model inside `with steer(model, ...)`, per context (thread / task).

Free functions and `SyncModel` calls prepend it to their own `steering=`; the context variable
keeps concurrent tasks and threads from seeing each other's blocks.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

from ie_core.ops import Steering
from ie_core.protocol import SteeringArg, steering_tuple

# Steering active inside `with steer(model, ...)`, per model, for this context (thread / task).
_ACTIVE: contextvars.ContextVar[tuple[tuple[int, tuple[Steering, ...]], ...]] = (
    contextvars.ContextVar("ie_active_steering", default=())
)


def _key(model: Any) -> int:
    """A mirror (`SyncModel.mirrors`, the model it wraps) shares its model's steering context."""
    return id(getattr(model, "mirrors", model))


def with_active(model: Any, steering: SteeringArg) -> tuple[Steering, ...]:
    """The steering active for `model` in this context (outer blocks first), then `steering`."""
    active = tuple(s for key, specs in _ACTIVE.get() if key == _key(model) for s in specs)
    return active + steering_tuple(steering)


@contextlib.contextmanager
def steer(model: Any, *specs: Steering) -> Iterator[None]:
    """Apply `specs` to every free-function and `SyncModel` call on `model` (an `InterpModel` or
    its `SyncModel`) inside the block (outer specs first)."""
    token = _ACTIVE.set((*_ACTIVE.get(), (_key(model), steering_tuple(specs))))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


__all__ = ["steer", "with_active"]
