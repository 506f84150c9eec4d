"""vLLM's streamed reductions: a GENERATE plan's reductions of the rows computed since the
previous token, each step's outputs in `StreamChunk.reduced` (`Flow.stream_steps`).

Lens top-k (`LensTopK`) is taken in the worker from the captured rows
(`LensWorkerMixin.ie_lens_collect_topk`), so no residual row ships back; served on backend 'vllm',
refused on vllm-static (rows live in its static taps) and vllm-generate (no hooks). Under
pipeline parallelism a layer's rows live on its stage and the final norm and unembed on the last
one; under tensor parallelism rows are kept on rank 0 while the unembed is split over every rank.
Either way each step's rows come to the host, are carried by the transports there, and go to
every rank of the model for the top-k (`ie_lens_topk`, which gathers the vocabulary).

Every other reducer rides the request as a `ReducerSpec` and runs in the worker's registry
(dictionaries sent ahead by key), served where the variant has points (vllm, vllm-static)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any, cast

import torch
from ie_core.errors import UnsupportedOperationError
from ie_core.plan import Plan
from ie_core.protocol import StreamChunk, TopK
from ie_core.reduce import LensTopK, Reduction
from ie_core.reduce.host import Reduced, nested

from ie_vllm import payload
from ie_vllm.host import features
from ie_vllm.host.model_parts import ModelParts

__all__ = ["check_served", "reduced_stream"]


def check_served(model: ModelParts) -> None:
    """Refuse the lens stream where the model's variant does not serve it (`Variant.lens_stream`)."""
    model.variant.require_lens_stream()


def reduced_stream(model: ModelParts, plan: Plan) -> AsyncIterator[StreamChunk]:
    """Each generated token of `plan` with its reductions' outputs, checked before any request."""
    if plan.lora is not None:
        raise UnsupportedOperationError(
            f"a streamed read-out under the LoRA adapter {plan.lora.name!r} is not served on vLLM "
            "(its stream requests carry no adapter); read it on eager, or generate under the "
            "adapter and capture the rows with capture_generation"
        )
    lens = [r for r in plan.reductions if isinstance(r.reducer, LensTopK)]
    if lens and len(lens) != len(plan.reductions):
        raise UnsupportedOperationError(
            "a vLLM stream reduces either by the lens or in the worker's registry, not both in "
            "one request; stream the lens read-out and the others separately"
        )
    steps = _lens_steps(model, plan, lens) if lens else _registry_steps(model, plan)
    return model.flow.bridge(steps)


def _lens_steps(
    model: ModelParts, plan: Plan, lens: Sequence[Reduction]
) -> AsyncIterator[StreamChunk]:
    check_served(model)
    assert plan.sampling is not None
    admitted = features.admitted(model, lens)
    if len({r.address for r in admitted}) != len(admitted):
        raise UnsupportedOperationError(
            "one lens reduction per address in a vLLM stream (the worker reads each address's "
            "rows once); stream each k or transport of one address separately"
        )
    req = model.admission.request(
        plan.prompt, plan.sampling.max_new_tokens, [r.address for r in admitted], plan.steering
    )
    captures = req.captures
    reducers = {r.address: cast(LensTopK, r.reducer) for r in admitted}
    labels = {r.address: r.label for r in admitted}
    k = max(r.k for r in reducers.values())
    transports = {a: r.transport for a, r in reducers.items() if r.transport is not None}
    wire = payload.encode(dict(transports)) if transports else {}

    async def collect(key: str, start: int, stop: int) -> Reduced:
        if model.info.pp_size > 1 or model.info.tp_size > 1:
            tops = await _staged_topk(model, key, (start, stop), captures, k, transports)
        else:
            got = await model.engine.rpc_payload("ie_lens_collect_topk", key, start, stop, k, wire)
            tops = {a: TopK(got[f"{a}|ids"], got[f"{a}|probs"]) for a in captures}
        return {
            labels[a]: {"ids": t.ids[..., : reducers[a].k], "probs": t.probs[..., : reducers[a].k]}
            for a, t in tops.items()
        }

    return _chunks(model.flow.stream_steps(req.ids, plan.sampling, captures, req.steer, collect))


def _registry_steps(model: ModelParts, plan: Plan) -> AsyncIterator[StreamChunk]:
    model.admission.require_points("stream_features")
    sampling = plan.sampling
    assert sampling is not None
    req = model.admission.request(plan.prompt, sampling.max_new_tokens, (), plan.steering)
    reductions = features.admitted(model, plan.reductions)
    specs = features.reducer_specs(reductions, len(req.ids))

    async def collect(key: str, start: int, stop: int) -> Reduced:
        got = await model.channel.collect(key, start, stop, False)
        return {
            n: {o: t.cpu() for o, t in out.items()} for n, out in nested(got, reductions).items()
        }

    async def steps() -> AsyncIterator[StreamChunk]:
        await features.send_dictionaries(model, reductions)
        flow = model.flow.stream_steps(req.ids, sampling, (), req.steer, collect, specs)
        async for chunk in _chunks(flow):
            yield chunk

    return steps()


async def _chunks(steps: AsyncIterator[tuple[StreamChunk, Reduced]]) -> AsyncIterator[StreamChunk]:
    async for chunk, reduced in steps:
        yield replace(chunk, reduced=reduced)


async def _staged_topk(
    model: ModelParts,
    key: str,
    span: tuple[int, int],
    captures: Sequence[str],
    k: int,
    transports: dict[str, Any],
) -> dict[str, TopK]:
    """Rows from the stages holding them, carried here, top-k on the last stage: one call each."""
    rows = await model.channel.collect(key, span[0], span[1], False)
    parts = []
    for address in captures:
        r = rows[address]
        if address in transports:
            r = r.float() @ transports[address].to(r.device).T
        parts.append(r)
    flat = torch.cat(parts)
    got = await model.engine.rpc_payload(
        "ie_lens_topk", payload.encode({"rows": flat}), k, stateless=True
    )
    ids, probs = (
        got["ids"].split([p.shape[0] for p in parts]),
        got["probs"].split([p.shape[0] for p in parts]),
    )
    return {a: TopK(i, p) for a, i, p in zip(captures, ids, probs, strict=True)}
