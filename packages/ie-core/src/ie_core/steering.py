"""Steering specs: validated, frozen descriptions of writes to a point. Math lives in `steer_math`.

Each op turns the activation h at a site into h + delta (fp32 math, cast back). Vectors are
stored as tuples of floats so a spec is hashable, comparable and torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from ie_core.address import Address, AddressLike, to_address
from ie_core.errors import SteeringSpecError
from ie_core.points import get_point

Vector = tuple[float, ...]


class ArrayLike(Protocol):
    """A numpy array or torch tensor: anything with `tolist()`."""

    def tolist(self) -> Any: ...
    def __len__(self) -> int: ...


# What a spec accepts; it always stores a `Vector`.
VectorLike = Vector | Sequence[float] | ArrayLike


def as_vector(values: Any, label: str = "vector") -> Vector:
    """A finite, non-zero vector from a list, numpy array or torch tensor (1-D)."""
    if hasattr(values, "detach"):
        values = values.detach().cpu().double().reshape(-1).tolist()
    elif hasattr(values, "tolist"):
        values = values.tolist()
    try:
        vec = tuple(float(x) for x in values)
    except TypeError as exc:
        raise SteeringSpecError(f"{label} must be a 1-D sequence of numbers: {exc}") from None
    if not vec:
        raise SteeringSpecError(f"{label} is empty")
    if not all(math.isfinite(x) for x in vec):
        raise SteeringSpecError(f"{label} contains NaN or infinite values")
    if not any(vec):
        raise SteeringSpecError(f"{label} is all zeros; a direction needs a non-zero vector")
    return vec


def _finite(value: float, label: str) -> float:
    value = float(value)
    if not math.isfinite(value):
        raise SteeringSpecError(f"{label} must be finite, got {value}")
    return value


@dataclass(frozen=True)
class Additive:
    """delta = coeff * vector."""

    vector: VectorLike
    coeff: float = 1.0
    kind: Literal["additive"] = field(default="additive", init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "vector", as_vector(self.vector))
        object.__setattr__(self, "coeff", _finite(self.coeff, "coeff"))


@dataclass(frozen=True)
class Orthogonal:
    """Scale the component along u = v/|v| by coeff: 0 ablates it, 1 is a no-op."""

    vector: VectorLike
    coeff: float = 0.0
    kind: Literal["orthogonal"] = field(default="orthogonal", init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "vector", as_vector(self.vector))
        object.__setattr__(self, "coeff", _finite(self.coeff, "coeff"))


@dataclass(frozen=True)
class ProjectionCap:
    """Clamp the projection p = h . u into [min, max] (either bound may be None)."""

    vector: VectorLike
    min: float | None = None
    max: float | None = None
    kind: Literal["projection_cap"] = field(default="projection_cap", init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "vector", as_vector(self.vector))
        if self.min is None and self.max is None:
            raise SteeringSpecError("projection cap needs min, max or both")
        lo = None if self.min is None else _finite(self.min, "min")
        hi = None if self.max is None else _finite(self.max, "max")
        if lo is not None and hi is not None and lo > hi:
            raise SteeringSpecError(f"projection cap min {lo} is above max {hi}")
        object.__setattr__(self, "min", lo)
        object.__setattr__(self, "max", hi)


@dataclass(frozen=True)
class LensSteer:
    """j-lens steer: delta = strength * |h| * d^, rescaled so |delta| <= max_fraction * |h|."""

    direction: VectorLike
    strength: float = 1.0
    max_fraction: float = 1.0
    kind: Literal["lens_steer"] = field(default="lens_steer", init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "direction", as_vector(self.direction, "direction"))
        object.__setattr__(self, "strength", _finite(self.strength, "strength"))
        frac = _finite(self.max_fraction, "max_fraction")
        if frac <= 0:
            raise SteeringSpecError(f"max_fraction must be > 0, got {frac}")
        object.__setattr__(self, "max_fraction", frac)


@dataclass(frozen=True)
class LensAblate:
    """j-lens ablate: delta = -(h . d^) d^."""

    direction: VectorLike
    kind: Literal["lens_ablate"] = field(default="lens_ablate", init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "direction", as_vector(self.direction, "direction"))


@dataclass(frozen=True)
class LensSwap:
    """j-lens swap: delta = (h . s^)(t^ - s^), moving the source direction's mass to the target."""

    source: VectorLike
    target: VectorLike
    kind: Literal["lens_swap"] = field(default="lens_swap", init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "source", as_vector(self.source, "source"))
        object.__setattr__(self, "target", as_vector(self.target, "target"))
        if len(self.source) != len(self.target):
            raise SteeringSpecError(
                f"swap source has width {len(self.source)} but target has {len(self.target)}"
            )


SteeringOp = Additive | Orthogonal | ProjectionCap | LensSteer | LensAblate | LensSwap
OP_KINDS: dict[str, type] = {
    "additive": Additive,
    "orthogonal": Orthogonal,
    "projection_cap": ProjectionCap,
    "lens_steer": LensSteer,
    "lens_ablate": LensAblate,
    "lens_swap": LensSwap,
}


def op_width(op: SteeringOp) -> int:
    if isinstance(op, LensSwap):
        return len(op.source)
    if isinstance(op, LensSteer | LensAblate):
        return len(op.direction)
    return len(op.vector)


@dataclass(frozen=True)
class PositionMask:
    """Prompt positions *not* to steer. Generated positions are always steered."""

    positions: tuple[int, ...] = ()
    special_tokens: bool = False

    def __post_init__(self) -> None:
        pos = tuple(int(p) for p in self.positions)
        if any(p < 0 for p in pos):
            raise SteeringSpecError(f"mask positions must be >= 0, got {pos}")
        object.__setattr__(self, "positions", tuple(sorted(set(pos))))

    def masked(self, prompt_ids: Sequence[int], special_ids: Iterable[int] = ()) -> frozenset[int]:
        """Positions of `prompt_ids` left unsteered."""
        out = {p for p in self.positions if p < len(prompt_ids)}
        if self.special_tokens:
            special = set(special_ids)
            out |= {i for i, t in enumerate(prompt_ids) if t in special}
        return frozenset(out)


@dataclass(frozen=True)
class Steering:
    """Ops applied in order at one point on the listed layers (layer None for trunk points)."""

    point: str
    layers: tuple[int, ...]
    ops: tuple[SteeringOp, ...]
    mask: PositionMask = PositionMask()
    stream: int | None = None

    def __post_init__(self) -> None:
        point = get_point(self.point)
        if not point.writable:
            raise SteeringSpecError(f"{self.point!r} is a capture-only point and cannot be steered")
        layers = tuple(int(x) for x in self.layers)
        if point.per_layer and not layers:
            raise SteeringSpecError(f"{self.point!r} is per layer; give at least one layer")
        if not point.per_layer and layers:
            raise SteeringSpecError(f"{self.point!r} is a trunk point; give no layers")
        if any(x < 0 for x in layers):
            raise SteeringSpecError(f"layers must be >= 0, got {layers}")
        object.__setattr__(self, "layers", layers)
        ops = tuple(self.ops)
        if not ops:
            raise SteeringSpecError("a steering spec needs at least one op")
        for op in ops:
            if not isinstance(op, SteeringOp):
                raise SteeringSpecError(
                    f"unknown steering op {op!r}; use one of {', '.join(OP_KINDS)}"
                )
        widths = {op_width(op) for op in ops}
        if len(widths) > 1:
            raise SteeringSpecError(f"ops at one site have different widths {sorted(widths)}")
        object.__setattr__(self, "ops", ops)

    @property
    def width(self) -> int:
        return op_width(self.ops[0])

    def addresses(self) -> tuple[Address, ...]:
        if not self.layers:
            return (Address(self.point, None, self.stream),)
        return tuple(Address(self.point, layer, self.stream) for layer in self.layers)

    def check_width(self, expected: int) -> None:
        """Refuse a vector whose width is not the point's width on this model."""
        if self.width != expected:
            raise SteeringSpecError(
                f"steering vector for {self.point!r} has width {self.width}, "
                f"but the point is {expected} wide on this model"
            )


def steer_at(address: AddressLike, *ops: SteeringOp, mask: PositionMask | None = None) -> Steering:
    """Shorthand: `steer_at("resid_post.10", Additive(v, 4.0))`."""
    addr = to_address(address, check=True)
    layers = () if addr.layer is None else (addr.layer,)
    return Steering(addr.name, layers, ops, mask or PositionMask(), addr.stream)


def op_from_dict(data: dict[str, Any]) -> SteeringOp:
    """Build an op from JSON-like data: `{"kind": "additive", "vector": [...], "coeff": 2}`."""
    data = dict(data)
    kind = data.pop("kind", None)
    cls = OP_KINDS.get(str(kind))
    if cls is None:
        raise SteeringSpecError(f"unknown steering op {kind!r}; use one of {', '.join(OP_KINDS)}")
    try:
        return cls(**data)
    except TypeError as exc:
        raise SteeringSpecError(f"bad fields for {kind!r}: {exc}") from None
