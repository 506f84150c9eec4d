"""Eager's streaming lens read-out: the decode loop of `EagerModel._decode_loop` with reads, the
lens top-k taken from each forward's rows before the next token is sampled on."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from ie_core.address import AddressLike
from ie_core.lens_stream import LensStep
from ie_core.prompts import check_generation_length
from ie_core.protocol import SamplingParams, SteeringArg, StreamChunk, TopK, sampling_params

from ie_eager import lens, sampling
from ie_eager.hooks import Session

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
    ids = model._prompt_ids(tokens)
    params = sampling_params(params)
    check_generation_length(len(ids), params.max_new_tokens, model.max_positions)
    reads = [model.resolver.resolve(a) for a in addresses]
    session = Session(model.hf_model, reads, model._writes(steering, [ids]))
    gen = sampling.make_generator(params, model.device)
    eos = model._eos_ids() if params.stop_at_eos else set()
    inputs = torch.tensor([ids], dtype=torch.long, device=model.device)
    past, position, out, emitted = None, 0, [], ""
    for _ in range(params.max_new_tokens):
        session.offset = position
        session.batch_shape = (1, inputs.shape[1])
        with torch.no_grad(), session:
            step = model.hf_model(input_ids=inputs, past_key_values=past, use_cache=True)
            token = sampling.next_token(step.logits[0, -1], params, gen)
        past, position = step.past_key_values, position + inputs.shape[1]
        tops = {
            str(r.address): read_out(
                model, session.captured[r.address][0], k, transports.get(str(r.address))
            )
            for r in reads
        }
        out.append(token)
        text = model.tokenizer.decode(out, skip_special_tokens=True)
        # As generate_stream: emit only text that is complete so far (multi-byte characters).
        chunk = (
            text[len(emitted) :] if text.startswith(emitted) and "\ufffd" not in text[-1:] else ""
        )
        emitted += chunk
        yield LensStep(StreamChunk(token, chunk), tops)
        if token in eos:
            return
        inputs = torch.tensor([[token]], dtype=torch.long, device=model.device)
