"""vLLM's dictionary read-out: each dictionary is sent to the workers once (by content key) and
every request names it in an `sae` reducer, so the encode and the top-k run in the worker and only
`[rows, k]` (or the dense features when no k is given) cross to the host; and a linear probe's
per-token scores (`probe_scores`), computed in the worker so the rows never cross."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import torch
from ie_core.experiments.probes import Probe
from ie_core.experiments.saes import SAE
from ie_core.protocol import SamplingParams, SteeringArg, StreamChunk

from ie_vllm import payload
from ie_vllm.host.model_parts import ModelParts
from ie_vllm.host.request import gather
from ie_vllm.specs import ReducerSpec

__all__ = [
    "dictionary_features",
    "dictionary_generation_stream",
    "dictionary_reducers",
    "generate_with_features",
    "probe_scores",
    "send_dictionaries",
]


async def send_dictionaries(model: ModelParts, saes: Mapping[str, SAE]) -> None:
    """Put each dictionary in every worker unless this model already did (idempotent there)."""
    sent: set[str] = model.__dict__.setdefault("_ie_sent_dictionaries", set())
    for sae in saes.values():
        if sae.key in sent:
            continue
        tensors = payload.encode({n: t.float() for n, t in sae.weights.items()})
        await model.engine.rpc("ie_put_dictionary", sae.key, tensors, sae.meta.to_dict())
        sent.add(sae.key)


def dictionary_reducers(
    model: ModelParts, saes: Mapping[str, SAE], k: int | None, stats: bool
) -> tuple[ReducerSpec, ...]:
    """One `sae` reducer per dictionary, its address checked as a capture would be."""
    out = []
    for name, sae in saes.items():
        (address,) = model.admission.captures([sae.address])
        params = {"dictionary": sae.key, "k": k, "stats": stats}
        out.append(ReducerSpec(name, "sae", address, params))
    return tuple(out)


async def dictionary_features(
    model: ModelParts,
    tokens: Any,
    saes: Mapping[str, SAE],
    *,
    k: int | None = None,
    stats: bool = False,
    steering: SteeringArg = None,
) -> dict[str, dict[str, torch.Tensor]]:
    """Per dictionary name, its outputs `[batch, seq, ...]` over one forward per prompt."""
    model.admission.require_points("feature_activations")
    prompts = _equal_length_prompts(model, tokens, "read")
    reducers = dictionary_reducers(model, saes, k, stats)

    async def all_prompts() -> list[dict[str, torch.Tensor]]:
        await send_dictionaries(model, saes)
        return await _one_step_each(model, prompts, reducers, steering)

    results = await model.flow.on_engine(all_prompts())
    return {name: _stack(name, results) for name in saes}


def probe_reducer(
    model: ModelParts, address: Any, weight: Any, bias: Any = 0.0, activation: str = "linear"
) -> ReducerSpec:
    """A `probe` reducer (`ie_core.experiments.probes.Probe`, checked here before any forward)."""
    (text,) = model.admission.captures([address])
    width = model.admission.info.widths[text]
    probe = Probe.build(weight, bias, activation, width=width, point=text)
    return ReducerSpec("probe", "probe", text, probe.to_params())


async def probe_scores(
    model: ModelParts,
    tokens: Any,
    address: Any,
    weight: Any,
    bias: Any = 0.0,
    activation: str = "linear",
    *,
    steering: SteeringArg = None,
) -> torch.Tensor:
    """activation(h . weight + bias) per token of each prompt at `address`: `[batch, seq]` for a
    vector, `[batch, seq, n]` for a matrix; only the scores leave the worker."""
    model.admission.require_points("probe_scores")
    prompts = _equal_length_prompts(model, tokens, "score")
    reducer = probe_reducer(model, address, weight, bias, activation)
    results = await model.flow.on_engine(_one_step_each(model, prompts, (reducer,), steering))
    return _stack("probe", results)["scores"]


def _equal_length_prompts(model: ModelParts, tokens: Any, verb: str) -> list[tuple[int, ...]]:
    """The prompts of one `[batch, seq]` read-out, each within the engine's length."""
    prompts = model.admission.prompts(tokens)
    if len({len(p) for p in prompts}) > 1:
        raise ValueError(
            f"prompts of different lengths {[len(p) for p in prompts]} cannot share one "
            f"[batch, seq] tensor; {verb} them one at a time or pad them to one length"
        )
    for ids in prompts:
        model.admission.check_length(ids, 1)
    return prompts


async def _one_step_each(
    model: ModelParts,
    prompts: Sequence[tuple[int, ...]],
    reducers: Sequence[ReducerSpec],
    steering: SteeringArg,
) -> list[dict[str, torch.Tensor]]:
    """One forward per prompt, all in flight together, returning each one's reducer outputs."""
    one = SamplingParams(max_new_tokens=1, stop_at_eos=False)

    async def one_prompt(ids: tuple[int, ...]) -> dict[str, torch.Tensor]:
        steer = model.admission.steer_specs(steering, ids)
        _, rows = await model.flow.run(ids, one, (), steer, reducers=tuple(reducers))
        return rows

    return list(await gather(*(one_prompt(p) for p in prompts)))


def _stack(name: str, results: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    prefix = f"{name}|"
    outputs = sorted({key[len(prefix) :] for r in results for key in r if key.startswith(prefix)})
    if not outputs:
        raise RuntimeError(f"the worker returned no features for dictionary {name!r}")
    return {o: torch.stack([r[prefix + o].cpu() for r in results]) for o in outputs}


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
    reducers = dictionary_reducers(model, saes, k, False)
    ids_list = [model.admission.prompt_ids(p) for p in prompts]
    for ids in ids_list:
        model.admission.check_length(ids, params.max_new_tokens)

    async def one(ids: tuple[int, ...]) -> tuple[tuple[int, ...], dict[str, torch.Tensor]]:
        steer = model.admission.steer_specs(steering, ids)
        return await model.flow.run(ids, params, (), steer, reducers=reducers)

    async def all_prompts() -> list[tuple[tuple[int, ...], dict[str, torch.Tensor]]]:
        await send_dictionaries(model, saes)
        return await gather(*(one(i) for i in ids_list))

    return await model.flow.on_engine(all_prompts())


async def dictionary_generation_stream(
    model: ModelParts,
    prompt: Any,
    saes: Mapping[str, SAE],
    params: SamplingParams,
    *,
    k: int,
    steering: SteeringArg = None,
) -> AsyncIterator[tuple[StreamChunk, dict[str, dict[str, torch.Tensor]]]]:
    """Each generated token with, per dictionary, the top-k features of the rows computed since
    the previous token (the first token carries the prompt's rows), reduced in the worker."""
    model.admission.require_points("stream_features")
    req = model.admission.request(prompt, params.max_new_tokens, (), steering)
    ids, steer = req.ids, req.steer
    reducers = dictionary_reducers(model, saes, k, False)

    async def collect(key: str, start: int, stop: int) -> dict[str, dict[str, torch.Tensor]]:
        got = await model.channel.collect(key, start, stop, False)
        return {n: {o: got[f"{n}|{o}"].cpu() for o in ("ids", "values")} for n in saes}

    async def steps() -> AsyncIterator[tuple[StreamChunk, dict[str, dict[str, torch.Tensor]]]]:
        await send_dictionaries(model, saes)
        async for item in model.flow.stream_steps(ids, params, (), steer, collect, reducers):
            yield item

    async for item in model.flow.bridge(steps()):
        yield item
