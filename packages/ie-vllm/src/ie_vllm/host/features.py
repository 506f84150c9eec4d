"""vLLM's reductions on the host side: a plan's reductions admitted (addresses resolved, each
reducer checked against its point's width and the vocabulary), each dictionary sent to the
workers once (by content key, so a request names it and never ships it) and each reduction as the
spec a request carries (`ReducerSpec`, the final row's position where it reads only that); and
the streamed dictionary read-outs (per step, reduced in the worker)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch
from ie_core.experiments.saes import SAE
from ie_core.protocol import SamplingParams, SteeringArg
from ie_core.reduce import AtlasTopK, DictionaryFeatures, Reduction
from ie_core.reduce.host import check_reductions

from ie_vllm import payload
from ie_vllm.host.model_parts import ModelParts
from ie_vllm.host.request import gather
from ie_vllm.specs import ReducerSpec

__all__ = [
    "admitted",
    "dictionary_reducers",
    "generate_with_features",
    "reducer_specs",
    "send_dictionaries",
]


def admitted(model: ModelParts, reductions: Sequence[Reduction]) -> tuple[Reduction, ...]:
    """The reductions at their canonical addresses, each checked here before any forward."""
    out = tuple(replace(r, address=model.admission.captures([r.address])[0]) for r in reductions)
    widths = model.admission.info.widths
    check_reductions(out, lambda a: widths[a], model.admission.vocab())
    return out


def reducer_specs(reductions: Sequence[Reduction], prompt_len: int) -> tuple[ReducerSpec, ...]:
    """What one request of `prompt_len` tokens carries: a reduction of the last row reads only
    the prompt's final position."""
    return tuple(
        ReducerSpec(r.label, r.address, r.reducer, prompt_len - 1 if r.last else None)
        for r in reductions
    )


def _dictionaries(reductions: Iterable[Reduction]) -> list[SAE]:
    return [
        r.reducer.sae
        for r in reductions
        if isinstance(r.reducer, DictionaryFeatures | AtlasTopK) and r.reducer.sae is not None
    ]


async def send_dictionaries(model: ModelParts, reductions: Iterable[Reduction]) -> None:
    """Put each dictionary in every worker unless this model already did (idempotent there)."""
    sent: set[str] = model.__dict__.setdefault("_ie_sent_dictionaries", set())
    for sae in _dictionaries(reductions):
        if sae.key in sent:
            continue
        tensors = payload.encode({n: t.float() for n, t in sae.weights.items()})
        await model.engine.rpc("ie_put_dictionary", sae.key, tensors, sae.meta.to_dict())
        sent.add(sae.key)


def dictionary_reducers(
    model: ModelParts, saes: Mapping[str, SAE], k: int | None, stats: bool
) -> tuple[Reduction, ...]:
    """One dictionary reduction per name, its address checked as a capture would be."""
    chosen = [
        Reduction(s.address, DictionaryFeatures(s.key, k, stats, s), n) for n, s in saes.items()
    ]
    return admitted(model, chosen)


async def generate_with_features(
    model: ModelParts,
    prompts: Sequence[Any],
    saes: Mapping[str, SAE],
    params: SamplingParams,
    *,
    k: int,
    steering: SteeringArg = None,
) -> list[tuple[tuple[int, ...], dict[str, torch.Tensor]]]:
    """Generate every prompt together; per prompt its token ids and, per `name|output`, the top-k
    features at every position of prompt + generated[:-1] (computed in the worker per step)."""
    model.admission.require_points("generate_with_features")
    reductions = dictionary_reducers(model, saes, k, False)
    ids_list = [model.admission.prompt_ids(p) for p in prompts]
    for ids in ids_list:
        model.admission.check_length(ids, params.max_new_tokens)

    async def one(ids: tuple[int, ...]) -> tuple[tuple[int, ...], dict[str, torch.Tensor]]:
        steer = model.admission.steer_specs(steering, ids)
        specs = reducer_specs(reductions, len(ids))
        return await model.flow.run(ids, params, (), steer, reducers=specs)

    async def all_prompts() -> list[tuple[tuple[int, ...], dict[str, torch.Tensor]]]:
        await send_dictionaries(model, reductions)
        return await gather(*(one(i) for i in ids_list))

    return await model.flow.on_engine(all_prompts())
