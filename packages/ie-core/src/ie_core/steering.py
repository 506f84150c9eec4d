"""Steering specs: validated, frozen descriptions of writes to a point. Math lives in `steer_math`.

Each op turns the activation h at a site into h + delta (fp32 math, cast back). Vectors are
stored as tuples of floats so a spec is hashable, comparable and torch-free.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ie_core.address import Address, AddressLike, to_address
from ie_core.errors import SteeringSpecError
from ie_core.feature_ops import FeatureClamp
from ie_core.interventions import Hook, Patch, Scale, check_heads
from ie_core.peer_names import point_name
from ie_core.points import get_point
from ie_core.spec_values import (
    FLOAT32_MAX,
    VectorLike,
    as_vector,
    integer,
    real_number,
)


@dataclass(frozen=True)
class Additive:
    """delta = coeff * vector."""

    vector: VectorLike
    coeff: float = 1.0
    kind: Literal["additive"] = field(default="additive", init=False)

    def __post_init__(self) -> None:
        vector = as_vector(self.vector)
        coeff = real_number(self.coeff, "coeff")
        peak = abs(coeff) * max(abs(x) for x in vector)
        if peak > FLOAT32_MAX:
            raise SteeringSpecError(
                f"coeff * vector reaches {peak:g}, which overflows float32 (max "
                f"{FLOAT32_MAX:.4g}), the dtype the steering math runs in; use a smaller coeff"
            )
        object.__setattr__(self, "vector", vector)
        object.__setattr__(self, "coeff", coeff)


@dataclass(frozen=True)
class Orthogonal:
    """Scale the component along u = v/|v| by coeff: 0 ablates it, 1 is a no-op."""

    vector: VectorLike
    coeff: float = 0.0
    kind: Literal["orthogonal"] = field(default="orthogonal", init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "vector", as_vector(self.vector))
        object.__setattr__(self, "coeff", real_number(self.coeff, "coeff"))


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
        lo = None if self.min is None else real_number(self.min, "min")
        hi = None if self.max is None else real_number(self.max, "max")
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
        object.__setattr__(self, "strength", real_number(self.strength, "strength"))
        frac = real_number(self.max_fraction, "max_fraction")
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


SteeringOp = (
    Additive
    | Orthogonal
    | ProjectionCap
    | LensSteer
    | LensAblate
    | LensSwap
    | FeatureClamp
    | Patch
    | Scale
    | Hook
)
# Ops that travel as JSON; a `Hook` holds a Python function and never leaves its process.
OP_KINDS: dict[str, type] = {
    "additive": Additive,
    "orthogonal": Orthogonal,
    "projection_cap": ProjectionCap,
    "lens_steer": LensSteer,
    "lens_ablate": LensAblate,
    "lens_swap": LensSwap,
    "patch": Patch,
    "scale": Scale,
    "feature_clamp": FeatureClamp,
}


def op_width(op: SteeringOp) -> int | None:
    """The width an op's own values fix; None for `Scale` and `Hook`, which fit any width."""
    if isinstance(op, Scale | Hook):
        return None
    if isinstance(op, Patch):
        return op.width
    if isinstance(op, LensSwap):
        return len(op.source)
    if isinstance(op, LensSteer | LensAblate):
        return len(op.direction)
    return len(op.vector)


@dataclass(frozen=True)
class PositionMask:
    """Prompt positions *not* to steer. Generated positions are steered unless `prefill_only`;
    `skip_bos` leaves position 0 alone when the prompt opens with a special token (its BOS)."""

    positions: tuple[int, ...] = ()
    special_tokens: bool = False
    prefill_only: bool = False
    skip_bos: bool = False

    def __post_init__(self) -> None:
        pos = tuple(integer(p, "mask position") for p in _items(self.positions, "positions"))
        for name in ("special_tokens", "prefill_only", "skip_bos"):
            if not isinstance(getattr(self, name), bool):
                raise SteeringSpecError(
                    f"{name} must be True or False, got {getattr(self, name)!r}"
                )
        object.__setattr__(self, "positions", tuple(sorted(set(pos))))

    def masked(self, prompt_ids: Sequence[int], special_ids: Iterable[int] = ()) -> frozenset[int]:
        """Positions of `prompt_ids` left unsteered; a position past the prompt is refused."""
        past = [p for p in self.positions if p >= len(prompt_ids)]
        if past:
            raise SteeringSpecError(
                f"mask positions {past} are past the prompt, which has {len(prompt_ids)} tokens "
                f"(positions 0..{len(prompt_ids) - 1}); masks name prompt positions only "
                "(generated tokens are always steered), so drop them or lengthen the prompt"
            )
        out = set(self.positions)
        if self.special_tokens:
            special = set(special_ids)
            out |= {i for i, t in enumerate(prompt_ids) if t in special}
        return frozenset(out)


def _items(values: Any, label: str) -> tuple[Any, ...]:
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise SteeringSpecError(
            f"{label} must be a sequence, got {type(values).__name__} {values!r}; "
            "wrap a single value in a tuple"
        )
    return tuple(values)


@dataclass(frozen=True)
class Steering:
    """Ops applied in order at one point on the listed layers (layer None for trunk points)."""

    point: str
    layers: tuple[int, ...]
    ops: tuple[SteeringOp, ...]
    mask: PositionMask = PositionMask()
    stream: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.point, str):
            raise SteeringSpecError(f"point must be a point name, got {self.point!r}")
        point = get_point(point_name(self.point))  # ours, or a TL / nnterp spelling
        object.__setattr__(self, "point", point.name)
        if not point.writable:
            raise SteeringSpecError(f"{self.point!r} is a capture-only point and cannot be steered")
        layers = tuple(integer(x, "layer") for x in _items(self.layers, "layers"))
        if point.per_layer and not layers:
            raise SteeringSpecError(f"{self.point!r} is per layer; give at least one layer")
        if not point.per_layer and layers:
            raise SteeringSpecError(f"{self.point!r} is a trunk point; give no layers")
        repeated = sorted({x for x in layers if layers.count(x) > 1})
        if repeated:
            raise SteeringSpecError(
                f"layers {repeated} are listed more than once, which would apply the ops twice "
                "there; list each layer once (put repeated ops in `ops`)"
            )
        object.__setattr__(self, "layers", layers)
        if isinstance(self.ops, SteeringOp):
            raise SteeringSpecError("ops must be a tuple of ops; wrap a single op: (op,)")
        ops = _items(self.ops, "ops")
        if not ops:
            raise SteeringSpecError("a steering spec needs at least one op")
        for op in ops:
            if not isinstance(op, SteeringOp):
                raise SteeringSpecError(
                    f"unknown steering op {op!r}; use one of {', '.join(OP_KINDS)}"
                )
        widths = {w for w in map(op_width, ops) if w is not None}
        if len(widths) > 1:
            raise SteeringSpecError(f"ops at one site have different widths {sorted(widths)}")
        object.__setattr__(self, "ops", ops)
        if not isinstance(self.mask, PositionMask):
            raise SteeringSpecError(f"mask must be a PositionMask, got {type(self.mask).__name__}")
        if self.stream is not None:
            object.__setattr__(self, "stream", integer(self.stream, "stream"))

    @property
    def width(self) -> int | None:
        """The ops' width, or None when every op is a `Scale` (which fits any width)."""
        return next((w for w in map(op_width, self.ops) if w is not None), None)

    def addresses(self) -> tuple[Address, ...]:
        if not self.layers:
            return (Address(self.point, None, self.stream),)
        return tuple(Address(self.point, layer, self.stream) for layer in self.layers)

    def check_width(self, expected: int) -> None:
        """Refuse a vector whose width is not the point's width on this model (and heads that
        do not split it)."""
        for op in self.ops:
            if isinstance(op, Patch | Scale):
                check_heads(op.heads, op.head_dim, expected, f"{self.point}: {op.kind}")
        if self.width is not None and self.width != expected:
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
