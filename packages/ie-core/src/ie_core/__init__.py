"""interp-engine core: addresses, the 38 points, families, the backend protocol, steering specs,
`load_model` and the free functions. Importing this package never imports torch.

Every name the docs import from a submodule is also a name here (`from ie_core import
patch_sweep, logit_diff, load_sae, attribute`), imported on first use (`LAZY`), so that
`import ie_core` stays light; the old module paths (`ie_core.patching`, ...) still import, with a
DeprecationWarning (`ie_core.moved`)."""

import importlib
from importlib.metadata import version
from typing import Any

from ie_core import moved
from ie_core.api import (
    capture,
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
    "capture",
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

# name -> the module that defines it: the docs' imports from submodules, loaded on first use.
LAZY: dict[str, str] = {
    **dict.fromkeys(
        ("answer_prob", "logit_diff", "mean_activation", "patch_sweep"),
        "ie_core.experiments.patching",
    ),
    **dict.fromkeys(
        ("attribution_patch", "generate_with_hooks", "run_with_hooks"),
        "ie_core.experiments.user_hooks",
    ),
    **dict.fromkeys(("SAE", "from_tensors", "load_sae"), "ie_core.experiments.saes"),
    **dict.fromkeys(
        ("feature_activations", "feature_clamp", "feature_steer"), "ie_core.experiments.features"
    ),
    **dict.fromkeys(
        ("chat_spans", "expert_assignment", "head_contributions"), "ie_core.experiments.analysis"
    ),
    **dict.fromkeys(("JacobianLens", "jacobian_lens_topk"), "ie_core.experiments.jacobian_lens"),
    "stream_lens": "ie_core.experiments.lens_stream",
    **dict.fromkeys(("EmbeddedPrompt", "from_embeddings"), "ie_core.embedded"),
    **dict.fromkeys(
        ("patchscope", "read_patchscopes", "selfie"), "ie_core.experiments.patchscopes"
    ),
    "probe_scores": "ie_core.experiments.probes",
    "capture_ragged": "ie_core.experiments.ragged",
    "splice": "ie_core.experiments.splice",
    **dict.fromkeys(
        (
            "FeatureIntervention",
            "Graph",
            "TranscoderSet",
            "attention_shares",
            "attribute",
            "attribute_many",
            "attribute_state",
            "head_flows",
            "intervene",
            "load_transcoders",
            "prepare",
            "prune",
            "qk_weights_for",
            "random_transcoder",
            "write_graph_json",
        ),
        "ie_core.circuits",
    ),
    **dict.fromkeys(("normalized", "path_influence"), "ie_core.circuits.influence"),
    **dict.fromkeys(("open_harvest",), "ie_core.harvest"),
    **dict.fromkeys(("open_atlas", "merge_atlases"), "ie_core.atlas"),
    "load_shard": "ie_core.harvest.shards",
    "Conditional": "ie_core.ops",
    **dict.fromkeys(("LoraError", "LoraSpec"), "ie_core.lora"),
    **dict.fromkeys(("STEERING_XARG", "steering_to_wire"), "ie_core.wire"),
    "run": "ie_core.runner",
}
moved.install()


def __getattr__(name: str) -> Any:
    """A `LAZY` name, imported now; an old module path (`ie_core.patching`), with its warning."""
    if name in LAZY:
        value = getattr(importlib.import_module(LAZY[name]), name)
        globals()[name] = value
        return value
    if f"ie_core.{name}" in moved.MOVED:
        return moved.load_moved(f"ie_core.{name}")
    raise AttributeError(f"module 'ie_core' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *LAZY})
