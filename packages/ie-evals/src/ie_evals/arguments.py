"""What both harness adapters accept from their users: the loading options handed on to the
backend, and the error for an option they do not know (raised before any forward)."""

from __future__ import annotations

from typing import Any

from ie_core.errors import InterpError

# Keyword arguments handed on to `load_model` (the backend's own loading options).
LOAD_ARGS = ("dtype", "api_key", "max_model_len", "tensor_parallel_size", "quantization")


class EvalArgumentError(InterpError, ValueError):
    """An unknown or malformed model argument or generation option (refused before any forward)."""


def positive_int(value: Any, name: str) -> int | None:
    """`value` as given when it is a positive int; None stays None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise EvalArgumentError(f"{name} must be a positive integer, got {value!r}")
    return value


__all__ = ["LOAD_ARGS", "EvalArgumentError", "positive_int"]
