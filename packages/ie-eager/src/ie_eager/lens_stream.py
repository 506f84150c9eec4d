"""Eager's streaming lens read-out: the one decode loop (`ie_eager.decode`) with reads, the lens
top-k taken from each forward's rows as its token is yielded."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Protocol

import torch
from ie_core.experiments.lens_stream import LensStep
from ie_core.grammar import AddressLike
from ie_core.protocol import SamplingParams, SteeringArg, StreamChunk, TopK
from ie_core.text_stream import TextStream
from torch import nn

from ie_eager import lens
from ie_eager.admission import EagerAdmission
from ie_eager.decode import decode_steps
from ie_eager.resolve import Resolver

__all__ = ["LensStreamModel", "lens_generation_stream"]


class LensStreamModel(lens.LensModel, Protocol):
    """The lens's parts plus what one decode loop needs: the request checks, the address
    resolver, the tokenizer (for the streamed text) and the HF model."""

    @property
    def admission(self) -> EagerAdmission: ...

    @property
    def resolver(self) -> Resolver: ...

    @property
    def tokenizer(self) -> Any: ...

    @property
    def hf_model(self) -> nn.Module: ...


def read_out(
    model: LensStreamModel, rows: torch.Tensor, k: int, transport: torch.Tensor | None
) -> TopK:
    if transport is not None:
        rows = rows.float() @ transport.to(rows.device).T
    return lens.topk(model, rows, k)


async def lens_generation_stream(
    model: LensStreamModel,
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
