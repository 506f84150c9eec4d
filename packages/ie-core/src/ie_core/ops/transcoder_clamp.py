"""`TranscoderClamp`: set one transcoder feature to a value at the transcoder's output point,
keeping the transcoder's error. Built by `ie_core.circuits.interventions`.

A transcoder reads one point (`mlp_in.L`) and writes another (`mlp_out.L`, or every later
layer's for a cross-layer transcoder), so the feature's activation is judged at the read point
and the decoder row is written at the later one, in the same forward: each token, prompt or
generated, is clamped by its own activation. The read uses the machinery of a `Conditional` with
`read` (a backend judges the earlier point and hands the result to the write). The delta is
bounded as `FeatureClamp`'s is, and refused by the same check.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from ie_core.errors import SteeringSpecError
from ie_core.grammar import to_address
from ie_core.ops.base import Op
from ie_core.ops.conditional import check_earlier_read
from ie_core.ops.feature_clamp import ROW_NORM_MAX, activation_of, delta_bound
from ie_core.ops.values import FLOAT32_MAX, absolute_positions, as_row, real_number
from ie_core.ops.vectors import cached, on_device, position_hits, share_cache

if TYPE_CHECKING:
    from torch import Tensor


def _positions(value: Any) -> tuple[int, ...] | None:
    found = absolute_positions(
        value, "clamp", "for all", " or are negative; give each absolute position once"
    )
    return None if found is None else tuple(sorted(found))


@dataclass(frozen=True)
class TranscoderClamp(Op):
    """delta = (value - a(x)) * decoder, a(x) = relu(p) * (p > threshold), p = x . encoder + bias,
    with x the same token's row at `read` (the transcoder's input point) in this forward.

    Written at the transcoder's output point, it equals the transcoder's output with the feature
    set to `value` plus the unchanged error. `positions` (absolute) limits it to some tokens."""

    encoder: Any
    decoder: Any
    read: str
    bias: float = 0.0
    threshold: float = 0.0
    value: float = 0.0
    positions: Any = None
    kind: Literal["transcoder_clamp"] = field(default="transcoder_clamp", init=False)

    def __post_init__(self) -> None:
        enc, dec = as_row(self.encoder, "encoder"), as_row(self.decoder, "decoder")
        object.__setattr__(self, "encoder", enc)
        object.__setattr__(self, "decoder", dec)
        if not isinstance(self.read, str):
            raise SteeringSpecError(f"read must be an address string, got {self.read!r}")
        object.__setattr__(self, "read", str(to_address(self.read, check=True)))
        for name in ("bias", "threshold", "value"):
            object.__setattr__(self, name, real_number(getattr(self, name), name))
        object.__setattr__(self, "positions", _positions(self.positions))
        bound = delta_bound(enc, dec, self.bias, self.value)
        if bound > FLOAT32_MAX / 2:
            raise SteeringSpecError(
                f"this TranscoderClamp could write {bound:.3g} (|value| + |bias| + "
                f"{ROW_NORM_MAX:g} * |encoder|, times max|decoder|), beyond float32's range; "
                "a trained transcoder's |encoder| * max|decoder| is near 1: rescale them"
            )

    @property
    def width(self) -> int:
        return len(self.decoder)

    def peak(self) -> tuple[float, str]:
        peak = abs(self.value) * max(abs(x) for x in self.decoder)
        return peak, f"transcoder clamp value * decoder reaches {peak:g}"

    def first_position(self) -> int:
        return 0 if self.positions is None else self.positions[0]

    def check_site(self, address: str) -> None:
        check_earlier_read(self.read, address)

    def condition_read(self, address: str) -> str:
        return self.read

    def check_read(self, width_of: Callable[[str], int]) -> None:
        if (width := width_of(self.read)) != len(self.encoder):
            raise SteeringSpecError(
                f"the encoder is {len(self.encoder)} wide but the clamp reads {self.read}, "
                f"{width} wide on this model; load the transcoder trained for this model"
            )

    def judge(self, rows: Tensor) -> Tensor:
        """The feature's activation per row of the read point, in float64 so that every backend
        handed the same fp32 rows clamps by the same amount."""
        h64 = rows.double()
        encoder = cached(self, "encoder", h64, lambda: on_device(self.encoder, h64))
        return activation_of(h64, encoder, self.bias, self.threshold)

    def judged(self, held: Tensor) -> Op:
        clamped = Clamped(self.decoder, self.value, held, self.positions)
        share_cache(self, clamped)  # built every forward; the vectors stay this op's
        return clamped

    def delta(self, h: Tensor) -> Tensor:
        raise TypeError(
            f"a TranscoderClamp reads its feature at {self.read}; a backend judges it there and "
            "writes the judged form (this op alone has no activation to clamp)"
        )

    def static_refusal(self) -> str:
        return (
            "a TranscoderClamp is not available on backend 'vllm-static': its feature is read "
            "at another point than the one written, which the compiled tables cannot carry; use "
            "backend='vllm' (the hooked engine) or 'eager'"
        )


@dataclass(frozen=True, eq=False)
class Clamped(Op):
    """A `TranscoderClamp` for one forward: its feature's activations `acts` (the written rows'
    shape without the width), judged at the read point. Built by the backend, never on a wire."""

    decoder: tuple[float, ...]
    value: float
    acts: Any
    positions: tuple[int, ...] | None = None
    kind: Literal["clamped"] = field(default="clamped", init=False)
    travels: ClassVar[bool] = False

    @property
    def width(self) -> int:
        return len(self.decoder)

    def apply(self, x: Tensor, positions: Tensor | None) -> Tensor:
        acts = self.acts.to(x.device).double()
        acts = acts.reshape(*acts.shape, *(1,) * (x.dim() - acts.dim()))
        decoder = cached(self, "decoder", acts, lambda: on_device(self.decoder, acts))
        delta = ((self.value - acts) * decoder).float()
        if self.positions is None:
            return x + delta
        hit = position_hits(self.positions, positions, x, "a clamp", owner=self).any(-1)
        return (x + delta).where(hit.unsqueeze(-1), x)


__all__ = ["Clamped", "TranscoderClamp"]
