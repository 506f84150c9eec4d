"""Circuit tracing: attribution graphs through per-layer or cross-layer transcoders (Ameisen et
al. 2025).

`attribute(model, prompt, transcoders)` captures one forward on the model's backend, then runs
batched backward passes through the frozen linear replacement (attention patterns and norm
scales fixed at the prompt's values, MLPs replaced by transcoder features plus error nodes).
`attribute_many(model, prompts, transcoders)` gives several prompts' graphs from one batched
capture. `intervene` clamps or ablates graph features in the live forward and reports how
the prediction moves. `prune` keeps the influential part, `graph_json` writes what circuit-tracer's and Neuronpedia's
viewers read. This package imports torch; `import ie_core` does not import it.
"""

from ie_core.circuits.attribution import (
    attribute,
    attribute_many,
    attribute_state,
    prepare,
    prepare_many,
)
from ie_core.circuits.clt import cross_layer_set, random_clt, write_clt
from ie_core.circuits.errors import (
    AttributionInputError,
    ReplacementUnsupportedError,
    TranscoderFormatError,
    TranscoderLayerError,
    TranscoderWidthError,
)
from ie_core.circuits.graph import Graph, LogitTarget, Node
from ie_core.circuits.graph_json import graph_json, write_graph_json
from ie_core.circuits.heads import HeadFlows, head_flows, top_edge_heads
from ie_core.circuits.interventions import (
    FeatureIntervention,
    InterventionResult,
    clamp_steering,
    intervene,
)
from ie_core.circuits.pruning import Pruned, prune
from ie_core.circuits.qk import QKShares, QKWeights, attention_shares, qk_weights_for
from ie_core.circuits.sources import load_transcoders
from ie_core.circuits.transcoders import TranscoderSet, random_transcoder, write_layer_file

__all__ = [
    "AttributionInputError",
    "FeatureIntervention",
    "Graph",
    "HeadFlows",
    "InterventionResult",
    "LogitTarget",
    "Node",
    "Pruned",
    "QKShares",
    "QKWeights",
    "ReplacementUnsupportedError",
    "TranscoderFormatError",
    "TranscoderLayerError",
    "TranscoderSet",
    "TranscoderWidthError",
    "attention_shares",
    "attribute",
    "attribute_many",
    "attribute_state",
    "clamp_steering",
    "cross_layer_set",
    "graph_json",
    "head_flows",
    "intervene",
    "load_transcoders",
    "prepare",
    "prepare_many",
    "prune",
    "qk_weights_for",
    "random_clt",
    "random_transcoder",
    "top_edge_heads",
    "write_clt",
    "write_graph_json",
    "write_layer_file",
]
