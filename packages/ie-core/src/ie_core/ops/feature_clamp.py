"""`FeatureClamp`: the steering op that sets one dictionary feature to a value and keeps the
reconstruction error, for dictionaries whose feature is a function of its own encoder column
(ReLU / JumpReLU, no input normalisation). Built by `ie_core.experiments.features.feature_clamp`.

Range: the delta is `(value - a(h)) * decoder` with `0 <= a(h) <= |h| |encoder| + |bias|`, so
`|delta| <= (|value| + |bias| + |h| |encoder|) * max|decoder|`. An op is refused when that bound,
for a row of norm `ROW_NORM_MAX`, passes half of float32's max: every accepted op then maps every
row of norm up to `ROW_NORM_MAX` to a finite row (`delta` computes it in float64, so
`h . encoder` cannot overflow on the way).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ie_core.errors import SteeringSpecError
from ie_core.ops.base import AffineForm, Op
from ie_core.ops.values import FLOAT32_MAX, as_row, real_number
from ie_core.ops.vectors import cached, on_device
from ie_core.ops.vectors import vector as tensor_of

if TYPE_CHECKING:
    from torch import Tensor

# The largest row norm an accepted clamp is guaranteed finite for. Real models' activations stay
# below ~1e5 (the "massive activations" of LLMs are ~1e4), so this leaves 25 orders of headroom
# while still accepting any dictionary whose |encoder| * max|decoder| is below ~1.7e8.
ROW_NORM_MAX = 1e30
_DELTA_MAX = FLOAT32_MAX / 2  # the row itself may hold up to the other half


def delta_bound(
    encoder: tuple[float, ...], decoder: tuple[float, ...], bias: float, value: float
) -> float:
    """The largest `|delta|` entry the clamp can write on a row of norm `ROW_NORM_MAX` (float64:
    the products of float32 values cannot overflow there)."""
    enc_norm = math.hypot(*encoder)
    dec_peak = max(abs(x) for x in decoder)
    return (abs(value) + abs(bias) + ROW_NORM_MAX * enc_norm) * dec_peak


def activation_of(h64: Tensor, encoder: Tensor, bias: float, threshold: float) -> Tensor:
    """A ReLU / JumpReLU feature's activation per float64 row: relu(p) * (p > threshold),
    p = h . encoder + bias, the encoder column a float64 tensor on the rows' device (shared by the
    clamps that write it)."""
    p = h64 @ encoder + bias
    return p.relu() * (p > threshold)


@dataclass(frozen=True)
class FeatureClamp(Op):
    """delta = (value - a(h)) * decoder, a(h) = relu(p) * (p > threshold), p = h . encoder + bias.

    Equals decode(features with this one set to `value`) + (h - decode(features(h))): the
    dictionary's reconstruction with the feature clamped, plus the unchanged error term."""

    encoder: Any
    decoder: Any
    bias: float = 0.0
    threshold: float = 0.0
    value: float = 0.0
    kind: Literal["feature_clamp"] = field(default="feature_clamp", init=False)

    def __post_init__(self) -> None:
        enc, dec = as_row(self.encoder, "encoder"), as_row(self.decoder, "decoder")
        if len(enc) != len(dec):
            raise SteeringSpecError(
                f"encoder ({len(enc)}) and decoder ({len(dec)}) widths differ: a clamp reads and "
                "writes one point, so a transcoder's feature cannot be clamped"
            )
        object.__setattr__(self, "encoder", enc)
        object.__setattr__(self, "decoder", dec)
        for name in ("bias", "threshold", "value"):
            object.__setattr__(self, name, real_number(getattr(self, name), name))
        bound = delta_bound(enc, dec, self.bias, self.value)
        if bound > _DELTA_MAX:
            raise SteeringSpecError(
                f"this FeatureClamp could write {bound:.3g} (|value| + |bias| + "
                f"{ROW_NORM_MAX:g} * |encoder|, times max|decoder|), beyond float32's range "
                f"for rows of norm up to {ROW_NORM_MAX:g}; a real dictionary's |encoder| * "
                "max|decoder| is near 1: rescale the encoder column or decoder row, or use "
                "feature_steer"
            )

    @property
    def vector(self) -> tuple[float, ...]:
        """The written direction (its width is the op's width, as for `Additive`)."""
        return self.decoder

    @property
    def width(self) -> int:
        return len(self.decoder)

    def peak(self) -> tuple[float, str]:
        peak = abs(self.value) * max(abs(x) for x in self.decoder)
        return peak, f"feature clamp value * decoder reaches {peak:g}"

    def delta(self, h: Tensor) -> Tensor:
        """Computed in float64: `h . encoder` of a huge row by a large encoder can pass float32's
        max even where the delta the range check above admits does not."""
        h64 = h.double()
        encoder = cached(self, "encoder", h64, lambda: on_device(self.encoder, h64))
        decoder = cached(self, "decoder", h64, lambda: on_device(self.decoder, h64))
        act = activation_of(h64, encoder, self.bias, self.threshold)
        return ((self.value - act).unsqueeze(-1) * decoder).float()

    def static_refusal(self) -> str | None:
        if self.threshold == 0.0:
            return None
        return (
            "a JumpReLU FeatureClamp is not available on backend 'vllm-static': its feature "
            "jumps at the threshold, which the compiled kernel's clamp form cannot express "
            "(ReLU clamps can); use backend='vllm' or 'eager', or feature_steer"
        )

    def affine(self, like: Tensor) -> AffineForm | None:
        """Affine where the threshold is 0: (v - relu(p + c)) * d = (-clamp(p, -c, inf) + v - c) * d
        with p = h . encoder (raw); a JumpReLU threshold is not affine."""
        if self.threshold != 0.0:
            return None
        enc, dec = tensor_of(self.encoder, like), tensor_of(self.decoder, like)
        return AffineForm(
            u=enc, w=dec, alpha=-1.0, beta=-1.0, lo=-self.bias, const=self.value - self.bias
        )


__all__ = ["ROW_NORM_MAX", "FeatureClamp", "activation_of", "delta_bound"]
