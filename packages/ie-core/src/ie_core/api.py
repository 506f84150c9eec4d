"""Synchronous free functions that work on any backend through the protocol."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ie_core.active_steering import steer, with_active
from ie_core.cache import ActivationCache
from ie_core.errors import BadPromptError
from ie_core.grammar import AddressLike
from ie_core.lora import LoraSpec
from ie_core.protocol import (
    Generation,
    GenerationCapture,
    Prompt,
    SamplingParams,
    SteeringArg,
    TopK,
)
from ie_core.runner import run
from ie_core.sync import ModelLike, SyncModel, unwrap
from ie_core.tl_shaped import (
    MAX_CACHE_BYTES,
    LogitsAndCache,
    NamesFilter,
    checked_everything,
    head_counts,
)


def capture(
    model: ModelLike,
    tokens: Prompt | Sequence[Sequence[int]],
    addresses: Sequence[AddressLike] | None = None,
    *,
    steering: SteeringArg = None,
    grad: bool = False,
    names_filter: NamesFilter = None,
    max_cache_bytes: int = MAX_CACHE_BYTES,
) -> ActivationCache:
    """One forward over `tokens`, returning the requested points as `[batch, seq, ...]`: the
    cache alone (no logits computed; `run_with_cache` is TransformerLens's `(logits, cache)`).

    Without `addresses`, every point the model serves for reading, at every layer it serves it
    (its `capabilities()`), kept by `names_filter` (a callable asked with our name and the
    TransformerLens name, or a list of addresses or points); the size is estimated before the
    forward and refused above `max_cache_bytes` (2 GiB) with the number.
    `grad=True` keeps the autograd graph (eager); the vLLM backends refuse it up front."""
    model = unwrap(model)
    if addresses is None:
        addresses = checked_everything(model, tokens, names_filter, max_cache_bytes)
    elif names_filter is not None:
        raise BadPromptError("give addresses or names_filter, not both")
    extra: dict[str, Any] = {"grad": True} if grad else {}  # a minimal InterpModel need not take it
    cache = run(model.capture(tokens, addresses, steering=with_active(model, steering), **extra))
    return cache.with_heads(*head_counts(model))  # so `cache.heads("z.5")` needs no n_heads


def run_with_cache(
    model: ModelLike,
    tokens: Prompt | Sequence[Sequence[int]],
    addresses: Sequence[AddressLike] | None = None,
    *,
    steering: SteeringArg = None,
    grad: bool = False,
    names_filter: NamesFilter = None,
    max_cache_bytes: int = MAX_CACHE_BYTES,
) -> LogitsAndCache:
    """`(logits, cache)` from one forward, as TransformerLens's `run_with_cache` and
    `SyncModel.run_with_cache`: logits `[batch, seq, vocab]` (the last block's output through
    the model's own unembed) and the cache of `capture`. For the cache alone, `capture(...)`."""
    sync = model if isinstance(model, SyncModel) else SyncModel(model)
    extra: dict[str, Any] = {"grad": True} if grad else {}
    return sync.run_with_cache(
        tokens,
        addresses,
        names_filter=names_filter,
        max_cache_bytes=max_cache_bytes,
        steering=steering,
        **extra,
    )


def capture_generation(
    model: ModelLike,
    tokens: Prompt,
    addresses: Sequence[AddressLike],
    *,
    max_new_tokens: int = 32,
    steering: SteeringArg = None,
    lora: LoraSpec | None = None,
    **sampling: Any,
) -> GenerationCapture:
    """Generate, then capture over prompt + generated[:-1] (under `lora`, given one)."""
    model = unwrap(model)
    params = SamplingParams(max_new_tokens=max_new_tokens, **sampling)
    extra: dict[str, Any] = {"lora": lora} if lora is not None else {}
    steer = with_active(model, steering)
    return run(model.capture_generation(tokens, addresses, params, steering=steer, **extra))


def capture_attention(
    model: ModelLike, tokens: Prompt, layers: Sequence[int] | None = None
) -> ActivationCache:
    """Attention probabilities `[batch, heads, q, k]` for `layers` (default: every attention layer)."""
    return run(unwrap(model).capture_attention(tokens, layers))


def generate(
    model: ModelLike,
    prompt: Prompt,
    *,
    max_new_tokens: int = 32,
    steering: SteeringArg = None,
    lora: LoraSpec | None = None,
    **sampling: Any,
) -> Generation:
    """Tokens after `prompt`, under `steering` and, given `lora`, a LoRA adapter (`ie_core.lora`)."""
    model = unwrap(model)
    params = SamplingParams(max_new_tokens=max_new_tokens, **sampling)
    extra: dict[str, Any] = {"lora": lora} if lora is not None else {}
    return run(model.generate(prompt, params, steering=with_active(model, steering), **extra))


def decode_residuals(
    model: ModelLike, rows: Any, k: int | None = None, *, grad: bool = False
) -> Any:
    """Logit lens: final norm + unembed (+ multiplier, softcap). With `k`, a TopK of ids and probs.

    `grad=True` (full logits only) keeps autograd on (eager); the vLLM backends refuse it."""
    model = unwrap(model)
    if grad:
        return run(model.decode_residuals(rows, grad=True))  # type: ignore[call-arg]
    if k is None:
        return run(model.decode_residuals(rows))
    result: TopK = run(model.decode_residuals_topk(rows, k))
    return result


__all__ = [
    "capture",
    "capture_attention",
    "capture_generation",
    "decode_residuals",
    "generate",
    "run_with_cache",
    "steer",
]
