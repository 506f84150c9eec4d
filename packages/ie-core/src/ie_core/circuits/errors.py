"""The named errors of circuit tracing: bad transcoder sets, prompts, models and thresholds."""

from __future__ import annotations

from ie_core.errors import DictionaryFormatError, DictionaryShapeError, InterpError


class TranscoderFormatError(DictionaryFormatError):
    """A transcoder folder or file that is not in circuit-tracer's per-layer format, or holds a
    part the graph cannot carry (a skip connection, a normalised input)."""


class TranscoderWidthError(DictionaryShapeError):
    """A transcoder whose input or output width is not the model's d_model."""


class TranscoderLayerError(DictionaryShapeError):
    """A transcoder set that misses a layer, repeats one, or reads / writes the wrong points."""


class ReplacementUnsupportedError(InterpError, NotImplementedError):
    """A model whose frozen linear replacement is not built here (its family or its backend)."""


class AttributionInputError(InterpError, ValueError):
    """A prompt, target or knob that attribute() cannot work with (empty, over the context,
    a threshold outside [0, 1], a non-positive batch size)."""


__all__ = [
    "AttributionInputError",
    "ReplacementUnsupportedError",
    "TranscoderFormatError",
    "TranscoderLayerError",
    "TranscoderWidthError",
]
