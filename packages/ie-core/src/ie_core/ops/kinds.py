"""The registry of op kinds: a new op is its own module plus one line here."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from ie_core.errors import SteeringSpecError
from ie_core.ops.additive import Additive
from ie_core.ops.base import Op
from ie_core.ops.conditional import Conditional
from ie_core.ops.feature_clamp import FeatureClamp
from ie_core.ops.hook import Hook
from ie_core.ops.lens_ablate import LensAblate
from ie_core.ops.lens_steer import LensSteer
from ie_core.ops.lens_swap import LensSwap
from ie_core.ops.orthogonal import Orthogonal
from ie_core.ops.patch import Patch
from ie_core.ops.projection_cap import ProjectionCap
from ie_core.ops.scale import Scale
from ie_core.ops.transcoder_clamp import TranscoderClamp

SteeringOp = Op
"""Any op; `Op` is the interface, the classes below its kinds."""

_ALL: tuple[type[Op], ...] = (
    Additive,
    Orthogonal,
    ProjectionCap,
    LensSteer,
    LensAblate,
    LensSwap,
    Patch,
    Scale,
    FeatureClamp,
    TranscoderClamp,
    Hook,
    Conditional,
)

# Ops that travel as JSON, by kind; a `Hook` holds a Python function and never leaves its process.
OP_KINDS: Mapping[str, type[Op]] = MappingProxyType(
    {cls.__dataclass_fields__["kind"].default: cls for cls in _ALL if cls.travels}  # type: ignore[attr-defined]
)


def _is_op_form(value: Any) -> bool:
    return isinstance(value, Mapping) and "kind" in value


def op_from_dict(data: Mapping[str, Any]) -> Op:
    """Build an op from JSON-like data: `{"kind": "additive", "vector": [...], "coeff": 2}`."""
    data = dict(data)
    kind = data.pop("kind", None)
    cls = OP_KINDS.get(str(kind))
    if cls is None:
        raise SteeringSpecError(f"unknown steering op {kind!r}; use one of {', '.join(OP_KINDS)}")
    # An op that wraps another (a Conditional) nests the inner op's own wire form.
    data = {k: op_from_dict(v) if _is_op_form(v) else v for k, v in data.items()}
    try:
        return cls(**data)
    except TypeError as exc:
        raise SteeringSpecError(f"bad fields for {kind!r}: {exc}") from None


__all__ = ["OP_KINDS", "SteeringOp", "op_from_dict"]
