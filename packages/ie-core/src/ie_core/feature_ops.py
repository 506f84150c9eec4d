"""`FeatureClamp`: the steering op that sets one dictionary feature to a value and keeps the
reconstruction error, for dictionaries whose feature is a function of its own encoder column
(ReLU / JumpReLU, no input normalisation). Built by `ie_core.features.feature_clamp`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from ie_core.errors import SteeringSpecError


def _floats(values: Any, label: str) -> tuple[float, ...]:
    out = tuple(float(x) for x in (values.tolist() if hasattr(values, "tolist") else values))
    if not out or not all(math.isfinite(x) for x in out):
        raise SteeringSpecError(f"{label} must be a non-empty vector of finite numbers")
    return out


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
            v = float(getattr(self, name))
            if not math.isfinite(v):
                raise SteeringSpecError(f"{name} must be finite, got {v}")
            object.__setattr__(self, name, v)

    @property
    def vector(self) -> tuple[float, ...]:
        """The written direction (its width is the op's width, as for `Additive`)."""
        return self.decoder


__all__ = ["FeatureClamp"]
