"""Synchronous free functions that work on any backend through the protocol."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from typing import Any

from ie_core.address import AddressLike
from ie_core.cache import ActivationCache
from ie_core.protocol import (
    Generation,
    GenerationCapture,
    InterpModel,
    Prompt,
    SamplingParams,
    SteeringArg,
    SyncModel,
    TopK,
    steering_tuple,
)
from ie_core.runner import run
from ie_core.steering import Steering

# Steering active inside `with steer(model, ...)`, per model, for this context (thread / task).
_ACTIVE: contextvars.ContextVar[tuple[tuple[int, tuple[Steering, ...]], ...]] = (
    contextvars.ContextVar("ie_active_steering", default=())
)


def _key(model: Any) -> int:
    """A `SyncModel` and the model it wraps share one steering context."""
    return id(model.model) if isinstance(model, SyncModel) else id(model)


def _with_active(model: Any, steering: SteeringArg) -> tuple[Steering, ...]:
    """The steering active for `model` in this context (outer blocks first), then `steering`."""
    active = tuple(s for key, specs in _ACTIVE.get() if key == _key(model) for s in specs)
    return active + steering_tuple(steering)


@contextlib.contextmanager
def steer(model: InterpModel | SyncModel, *specs: Steering) -> Iterator[None]:
    """Apply `specs` to every free-function and `SyncModel` call on `model` inside the block
    (outer specs first)."""
    token = _ACTIVE.set((*_ACTIVE.get(), (_key(model), steering_tuple(specs))))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def run_with_cache(
    model: InterpModel,
    tokens: Prompt | Sequence[Sequence[int]],
    addresses: Sequence[AddressLike],
    *,
    steering: SteeringArg = None,
    grad: bool = False,
) -> ActivationCache:
    """One forward over `tokens`, returning the requested points as `[batch, seq, ...]`.

    `grad=True` keeps the autograd graph (eager); the vLLM backends refuse it up front."""
    extra = {"grad": True} if grad else {}
    return run(model.capture(tokens, addresses, steering=_with_active(model, steering), **extra))


def capture_generation(
    model: InterpModel,
    tokens: Prompt,
    addresses: Sequence[AddressLike],
    *,
    max_new_tokens: int = 32,
    steering: SteeringArg = None,
    **sampling: Any,
) -> GenerationCapture:
    """Generate, then capture over prompt + generated[:-1]."""
    params = SamplingParams(max_new_tokens=max_new_tokens, **sampling)
    return run(
        model.capture_generation(tokens, addresses, params, steering=_with_active(model, steering))
    )


def capture_attention(
    model: InterpModel, tokens: Prompt, layers: Sequence[int] | None = None
) -> ActivationCache:
    """Attention probabilities `[batch, heads, q, k]` for `layers` (default: every attention layer)."""
    return run(model.capture_attention(tokens, layers))


def generate(
    model: InterpModel,
    prompt: Prompt,
    *,
    max_new_tokens: int = 32,
    steering: SteeringArg = None,
    **sampling: Any,
) -> Generation:
    params = SamplingParams(max_new_tokens=max_new_tokens, **sampling)
    return run(model.generate(prompt, params, steering=_with_active(model, steering)))


def decode_residuals(
    model: InterpModel, rows: Any, k: int | None = None, *, grad: bool = False
) -> Any:
    """Logit lens: final norm + unembed (+ multiplier, softcap). With `k`, a TopK of ids and probs.

    `grad=True` (full logits only) keeps autograd on (eager); the vLLM backends refuse it."""
    if grad:
        return run(model.decode_residuals(rows, grad=True))  # type: ignore[call-arg]
    if k is None:
        return run(model.decode_residuals(rows))
    result: TopK = run(model.decode_residuals_topk(rows, k))
    return result
