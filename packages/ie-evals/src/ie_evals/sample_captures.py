"""A sample's captured rows, for Inspect scorers: the provider (asked with `capture=`) keeps each
generation's `ActivationCache` in this process and puts its key in the sample's
`output.metadata`; `sample_captures(state)` gives it back. Tensors stay out of Inspect's logs
(which are JSON); they are held until `clear_captures()`."""

from __future__ import annotations

from typing import Any

from ie_core import ActivationCache
from ie_core.errors import InterpError

CAPTURE_KEY = "ie_captures"  # the key under which a sample's output.metadata names its rows
_KEPT: dict[str, ActivationCache] = {}


class CapturesUnavailableError(InterpError, LookupError):
    """A sample whose rows were not kept: the model was not asked to capture (`capture=`), or
    the rows were cleared, or the sample ran in another process (against a log file)."""


def keep_captures(cache: ActivationCache, key: str) -> str:
    _KEPT[key] = cache
    return key


def sample_captures(state: Any) -> ActivationCache:
    """The rows captured while `state`'s output was generated: prompt + generated[:-1], one row
    per position (`capture_generation`'s cache)."""
    metadata = getattr(getattr(state, "output", None), "metadata", None) or {}
    key = metadata.get(CAPTURE_KEY)
    if key is None:
        raise CapturesUnavailableError(
            "this sample's output carries no captures: give the interp-engine model "
            "capture=ADDRESSES (e.g. -M capture=resid_post.3)"
        )
    if key not in _KEPT:
        raise CapturesUnavailableError(
            f"the captures {key} are no longer held (cleared, or generated in another process)"
        )
    return _KEPT[key]


def clear_captures() -> None:
    """Drop every kept sample's rows."""
    _KEPT.clear()


__all__ = [
    "CAPTURE_KEY",
    "CapturesUnavailableError",
    "clear_captures",
    "keep_captures",
    "sample_captures",
]
