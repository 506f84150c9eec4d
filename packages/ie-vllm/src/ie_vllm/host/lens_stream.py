"""vLLM's streaming lens read-out: `Flow.stream_capture` with the top-k taken in the worker
(`LensWorkerMixin.ie_lens_collect_topk`) instead of shipping rows back. Served on backend 'vllm';
refused on vllm-static (rows live in its static taps) and vllm-generate (no hooks). Under
pipeline parallelism a layer's rows live on its stage and the final norm and unembed on the last
one; under tensor parallelism rows are kept on rank 0 while the unembed is split over every rank.
Either way each step's rows come to the host, are carried by the transports there, and go to
every rank of the model for the top-k (`ie_lens_topk`, which gathers the vocabulary)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import torch
from ie_core.experiments.lens_stream import LensStep
from ie_core.grammar import AddressLike
from ie_core.protocol import SamplingParams, SteeringArg, TopK

from ie_vllm import payload
from ie_vllm.host.model_parts import ModelParts

__all__ = ["lens_generation_stream"]


def check_served(model: ModelParts) -> None:
    """Refuse the stream where the model's variant does not serve it (`Variant.lens_stream`)."""
    model.variant.require_lens_stream()


async def lens_generation_stream(
    model: ModelParts,
    tokens: Any,
    addresses: Sequence[AddressLike],
    params: SamplingParams,
    *,
    k: int,
    transports: Mapping[str, torch.Tensor],
    steering: SteeringArg = None,
) -> AsyncIterator[LensStep]:
    check_served(model)
    req = model.admission.request(tokens, params.max_new_tokens, addresses, steering)
    captures = req.captures
    wire = payload.encode(dict(transports)) if transports else {}

    async def topk(key: str, start: int, stop: int) -> dict[str, TopK]:
        if model.info.pp_size > 1 or model.info.tp_size > 1:
            return await _staged_topk(model, key, (start, stop), captures, k, transports)
        got = await model.engine.rpc_payload("ie_lens_collect_topk", key, start, stop, k, wire)
        return {a: TopK(got[f"{a}|ids"], got[f"{a}|probs"]) for a in captures}

    steps = model.flow.stream_steps(req.ids, params, captures, req.steer, topk)
    async for chunk, tops in model.flow.bridge(steps):
        yield LensStep(chunk, tops)


async def _staged_topk(
    model: ModelParts,
    key: str,
    span: tuple[int, int],
    captures: Sequence[str],
    k: int,
    transports: Mapping[str, torch.Tensor],
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
