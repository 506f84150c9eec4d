"""Streamed dictionary features: each generated token with the top-k features of the rows computed
since the previous one (the first token carries the prompt's rows), as `stream_lens` cuts rows.
A streamed plan's `DictionaryFeatures` reductions (`ModelFront.dictionary_generation_stream`),
reduced where the rows live: eager in its forward, vllm and vllm-static in the worker; remote
refuses."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ie_core.active_steering import with_active
from ie_core.experiments.features import Features, check_dictionary
from ie_core.experiments.saes import SAE
from ie_core.protocol import SamplingParams, SteeringArg, StreamChunk
from ie_core.reduce import LensTopK
from ie_core.runner import iterate
from ie_core.sync import unwrap

__all__ = ["FeatureStep", "stream_features"]


@dataclass(frozen=True)
class FeatureStep:
    """One generated token and, per dictionary name, its new rows' top-k `Features` `[rows, k]`."""

    chunk: StreamChunk
    features: Mapping[str, Features]


def stream_features(
    model: Any,
    prompt: Any,
    saes: Mapping[str, SAE],
    *,
    k: int = 16,
    steering: SteeringArg = None,
    max_new_tokens: int = 16,
    **sampling: Any,
) -> Iterator[FeatureStep]:
    """Generate, yielding each token with the top-k features of its new rows per dictionary."""
    LensTopK(k)  # a positive k, checked before any request
    model, steering = unwrap(model), with_active(model, steering)
    for sae in saes.values():
        check_dictionary(model, sae)
    params = SamplingParams(max_new_tokens=max_new_tokens, **sampling)
    agen = model.dictionary_generation_stream(prompt, dict(saes), params, k=k, steering=steering)
    for chunk, got in iterate(agen):
        yield FeatureStep(chunk, {n: Features.from_outputs(o) for n, o in got.items()})
