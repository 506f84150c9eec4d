"""The values a steering or intervention spec accepts: finite float32 reals, non-negative ints,
and 1-D vectors, each refused with a sentence that says what to pass instead."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any, Protocol

from ie_core.errors import SteeringSpecError

Vector = tuple[float, ...]


class ArrayLike(Protocol):
    """A numpy array or torch tensor: anything with `tolist()`."""

    def tolist(self) -> Any: ...
    def __len__(self) -> int: ...


# What a spec accepts; it always stores a `Vector`.
VectorLike = Vector | Sequence[float] | ArrayLike


# The math runs in float32 (`steer_math`): values are checked against its range, not float64's.
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_MIN_NORMAL = 1.1754943508222875e-38


def real_number(value: Any, label: str) -> float:
    """A finite real that float32 can hold: int, float, numpy scalar or 0-d real tensor.

    Strings, bools and complex numbers are refused rather than coerced."""
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item") and _real_dtype(value):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise SteeringSpecError(
            f"{label} must be a real number (int or float), got {type(value).__name__} "
            f"{value!r}; pass a float"
        )
    value = float(value)
    if not math.isfinite(value):
        raise SteeringSpecError(f"{label} must be finite, got {value}")
    if abs(value) > FLOAT32_MAX:
        raise SteeringSpecError(
            f"{label} = {value:g} overflows float32 (max {FLOAT32_MAX:.4g}), the dtype the "
            "steering math runs in; use a smaller value"
        )
    return value


def integer(value: Any, label: str) -> int:
    """A non-negative int (numpy ints too); bools, floats and strings are refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise SteeringSpecError(
            f"{label} must be an int, got {type(value).__name__} {value!r}; floats are not "
            "truncated and bools are not ints"
        )
    if value < 0:
        raise SteeringSpecError(f"{label} must be >= 0, got {value}")
    return int(value)


def absolute_positions(value: Any, what: str, every: str, once: str = "") -> tuple[int, ...] | None:
    """Absolute positions as given (an int or ints, each at most once), or None: every position.

    `what` names the op in the refusals, `every` says what None does, `once` adds to the repeat
    refusal."""
    if value is None:
        return None
    items = (value,) if isinstance(value, int) else tuple(value)
    found = tuple(integer(p, f"{what} position") for p in items)
    if not found:
        raise SteeringSpecError(f"{what} positions are empty; give positions, or None {every}")
    if len(set(found)) != len(found):
        raise SteeringSpecError(f"{what} positions {list(found)} repeat a position{once}")
    return found


def _real_dtype(values: Any) -> bool:
    name = str(getattr(values, "dtype", "")).removeprefix("torch.")
    return "complex" not in name and name != "bool"


def as_vector(values: Any, label: str = "vector") -> Vector:
    """A 1-D vector of real numbers, finite and not all zero in float32 (list, numpy, torch)."""
    vec = as_row(values, label)
    peak = max(abs(x) for x in vec)
    if peak < FLOAT32_MIN_NORMAL:
        raise SteeringSpecError(
            f"{label} is all zeros or too small for float32, the dtype the steering math runs "
            f"in (largest entry {peak:g}, below its smallest normal {FLOAT32_MIN_NORMAL:.3g}, "
            "where the direction loses precision); a direction needs a non-zero vector: "
            "rescale it"
        )
    return vec


def as_row(values: Any, label: str = "values") -> Vector:
    """A 1-D row of finite float32 reals (zeros allowed: a row of activations, not a direction)."""
    if isinstance(values, str | bytes | numbers.Number):
        raise SteeringSpecError(
            f"{label} must be a 1-D sequence of numbers, got {type(values).__name__}"
        )
    ndim = getattr(values, "ndim", None)
    if ndim is not None and ndim != 1:
        shape = tuple(getattr(values, "shape", ()))
        raise SteeringSpecError(
            f"{label} must be 1-D, got shape {shape}; pick one row (e.g. v[0]) rather than "
            "letting it be flattened"
        )
    if ndim is not None and not _real_dtype(values):
        raise SteeringSpecError(
            f"{label} has dtype {values.dtype}; steering vectors are real numbers (a complex "
            "vector would lose its imaginary part)"
        )
    if hasattr(values, "detach"):
        values = values.detach().cpu().tolist()
    elif hasattr(values, "tolist"):
        values = values.tolist()
    try:
        items = list(values)
    except TypeError:
        raise SteeringSpecError(
            f"{label} must be a 1-D sequence of numbers, got {type(values).__name__}"
        ) from None
    vec = tuple(_element(x, label, i) for i, x in enumerate(items))
    if not vec:
        raise SteeringSpecError(f"{label} is empty")
    return vec


def _element(x: Any, label: str, i: int) -> float:
    if isinstance(x, list | tuple):
        raise SteeringSpecError(f"{label} must be 1-D; element {i} is a sequence")
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise SteeringSpecError(f"{label}[{i}] must be a real number, got {type(x).__name__} {x!r}")
    value = float(x)
    if not math.isfinite(value):
        raise SteeringSpecError(f"{label} contains NaN or infinite values (at {i})")
    if abs(value) > FLOAT32_MAX:
        raise SteeringSpecError(
            f"{label}[{i}] = {value:g} overflows float32 (max {FLOAT32_MAX:.4g}), the dtype "
            "the steering math runs in; rescale the vector"
        )
    return value
