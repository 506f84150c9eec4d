"""`FeatureClamp`: the steering op that sets one dictionary feature to a value and keeps the
reconstruction error, for dictionaries whose feature is a function of its own encoder column
(ReLU / JumpReLU, no input normalisation). Built by `ie_core.features.feature_clamp`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ie_core.errors import SteeringSpecError
from ie_core.spec_values import as_row, real_number

# The math runs in float32: the products of these values must stay finite there too.
_PRODUCT_MAX = 1.8e19  # sqrt(float32 max), so |value - a| * |decoder| cannot overflow


def _floats(values: Any, label: str) -> tuple[float, ...]:
    row = as_row(values, label)  # 1-D, finite, within float32
    if max(abs(x) for x in row) > _PRODUCT_MAX:
        raise SteeringSpecError(
            f"{label} has entries above {_PRODUCT_MAX:.2g}, where the clamp's float32 products "
            "overflow; rescale the dictionary"
        )
    return row


@dataclass(frozen=True)
class FeatureClamp:
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
        enc, dec = _floats(self.encoder, "encoder"), _floats(self.decoder, "decoder")
        if len(enc) != len(dec):
            raise SteeringSpecError(
                f"encoder ({len(enc)}) and decoder ({len(dec)}) widths differ: a clamp reads and "
                "writes one point, so a transcoder's feature cannot be clamped"
            )
        object.__setattr__(self, "encoder", enc)
        object.__setattr__(self, "decoder", dec)
        for name in ("bias", "threshold", "value"):
            v = real_number(getattr(self, name), name)
            if abs(v) > _PRODUCT_MAX:
                raise SteeringSpecError(
                    f"{name} = {v:g} is above {_PRODUCT_MAX:.2g}, where the clamp's float32 "
                    "products overflow"
                )
            object.__setattr__(self, name, v)

    @property
    def vector(self) -> tuple[float, ...]:
        """The written direction (its width is the op's width, as for `Additive`)."""
        return self.decoder


__all__ = ["FeatureClamp"]
