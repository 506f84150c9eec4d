"""Eager's streaming lens read-out: the one decode loop (`ie_eager.decode`) with reads, the lens
top-k taken from each forward's rows as its token is yielded."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from ie_core.address import AddressLike
from ie_core.lens_stream import LensStep
from ie_core.protocol import SamplingParams, SteeringArg, StreamChunk, TopK
from ie_core.text_stream import TextStream

from ie_eager import lens
from ie_eager.decode import decode_steps

if TYPE_CHECKING:
    from ie_eager.backend import EagerModel

__all__ = ["lens_generation_stream"]


def read_out(model: EagerModel, rows: torch.Tensor, k: int, transport: torch.Tensor | None) -> TopK:
    if transport is not None:
        rows = rows.float() @ transport.to(rows.device).T
    return lens.topk(model, rows, k)


async def lens_generation_stream(
    model: EagerModel,
    tokens: Any,
    addresses: Sequence[AddressLike],
    params: SamplingParams,
    *,
    k: int,
    transports: Mapping[str, torch.Tensor],
    steering: SteeringArg = None,
) -> AsyncIterator[LensStep]:
    ids = model.admission.prompt_ids(tokens)
    reads = [model.resolver.resolve(a) for a in addresses]
    text = TextStream(lambda out: model.tokenizer.decode(out, skip_special_tokens=True))
    for step in decode_steps(model.hf_model, model.admission, ids, params, steering, reads):
        tops = {
            str(r.address): read_out(
                model, step.rows[r.address][0], k, transports.get(str(r.address))
            )
            for r in reads
        }
        yield LensStep(StreamChunk(step.token, text.push(step.token)), tops)
