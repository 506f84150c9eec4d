"""interp-engine core: addresses, the 38 points, families, the backend protocol, steering specs,
`load_model` and the free functions. Importing this package never imports torch."""

from importlib.metadata import version

from ie_core.api import (
    capture_attention,
    capture_generation,
    decode_residuals,
    generate,
    run_with_cache,
    steer,
)
from ie_core.cache import ActivationCache
from ie_core.grammar import (
    FAMILIES,
    POINTS,
    Address,
    AddressLike,
    Family,
    Point,
    Trait,
    family_for_architecture,
    format_address,
    get_family,
    get_point,
    parse_address,
    to_address,
)
from ie_core.loading import available_backends, load_model
from ie_core.ops import (
    Additive,
    Hook,
    LensAblate,
    LensSteer,
    LensSwap,
    Orthogonal,
    Patch,
    PositionMask,
    ProjectionCap,
    Scale,
    Steering,
    steer_at,
)
from ie_core.protocol import (
    Generation,
    GenerationCapture,
    InterpModel,
    SamplingParams,
    StreamChunk,
    TopK,
)
from ie_core.sync import SyncModel

__version__ = version("ie-core")  # one source: the installed distribution's metadata

__all__ = [
    "FAMILIES",
    "POINTS",
    "ActivationCache",
    "Additive",
    "Address",
    "AddressLike",
    "Family",
    "Generation",
    "GenerationCapture",
    "Hook",
    "InterpModel",
    "LensAblate",
    "LensSteer",
    "LensSwap",
    "Orthogonal",
    "Patch",
    "Point",
    "PositionMask",
    "ProjectionCap",
    "SamplingParams",
    "Scale",
    "Steering",
    "StreamChunk",
    "SyncModel",
    "TopK",
    "Trait",
    "__version__",
    "available_backends",
    "capture_attention",
    "capture_generation",
    "decode_residuals",
    "family_for_architecture",
    "format_address",
    "generate",
    "get_family",
    "get_point",
    "load_model",
    "parse_address",
    "run_with_cache",
    "steer",
    "steer_at",
    "to_address",
]
