"""`Steering`: validated, frozen descriptions of ops applied at a point on given layers, and the
`PositionMask` of prompt positions they leave alone. Torch-free; each op owns its maths."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ie_core.errors import SteeringSpecError
from ie_core.grammar import Address, AddressLike, get_point, point_name, to_address
from ie_core.ops.base import Op
from ie_core.ops.kinds import OP_KINDS, SteeringOp
from ie_core.ops.values import integer


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
        if isinstance(self.ops, Op):
            raise SteeringSpecError("ops must be a tuple of ops; wrap a single op: (op,)")
        ops = _items(self.ops, "ops")
        if not ops:
            raise SteeringSpecError("a steering spec needs at least one op")
        for op in ops:
            if not isinstance(op, Op):
                raise SteeringSpecError(
                    f"unknown steering op {op!r}; use one of {', '.join(OP_KINDS)}"
                )
        widths = {op.width for op in ops if op.width is not None}
        if len(widths) > 1:
            raise SteeringSpecError(f"ops at one site have different widths {sorted(widths)}")
        object.__setattr__(self, "ops", ops)
        if not isinstance(self.mask, PositionMask):
            raise SteeringSpecError(f"mask must be a PositionMask, got {type(self.mask).__name__}")
        if self.stream is not None:
            object.__setattr__(self, "stream", integer(self.stream, "stream"))
        for op in ops:  # an op tied to a point (a condition read there) refuses the others
            for address in self.addresses():
                op.check_site(str(address))

    @property
    def width(self) -> int | None:
        """The ops' width, or None when every op is a `Scale` (which fits any width)."""
        return next((op.width for op in self.ops if op.width is not None), None)

    def addresses(self) -> tuple[Address, ...]:
        if not self.layers:
            return (Address(self.point, None, self.stream),)
        return tuple(Address(self.point, layer, self.stream) for layer in self.layers)

    def check_width(self, expected: int) -> None:
        """Refuse a vector whose width is not the point's width on this model (and heads that
        do not split it)."""
        for op in self.ops:
            op.check_width(expected, self.point)
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
