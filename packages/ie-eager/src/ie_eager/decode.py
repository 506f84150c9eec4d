"""Eager's one decode loop: prefill, then one token per forward on the KV cache, with hooks.

`generate`, `generate_stream`, `capture_generation` and the streaming lens all run it; the
hooks and no-grad mode are set around each forward only, so while a caller holds a yielded
step (a suspended stream), other requests on the model see neither.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from ie_core.grammar import Address
from ie_core.logprobs import StepLogprobs
from ie_core.prompts import check_generation_length
from ie_core.protocol import SamplingParams, SteeringArg, sampling_params
from torch import nn

from ie_eager import sampling
from ie_eager.admission import EagerAdmission
from ie_eager.hooks import Session
from ie_eager.logprobs import step_logprobs
from ie_eager.resolve import Resolved

__all__ = ["DecodeStep", "decode_steps"]


@dataclass(frozen=True)
class DecodeStep:
    """One sampled token, its logprobs (when asked) and the rows this forward read."""

    token: int
    logprobs: StepLogprobs | None
    rows: Mapping[Address, torch.Tensor]  # `[1, tokens of this forward, ...]` per read


def decode_steps(
    hf_model: nn.Module,
    admission: EagerAdmission,
    ids: list[int],
    params: SamplingParams,
    steering: SteeringArg = None,
    reads: Sequence[Resolved] = (),
) -> Iterator[DecodeStep]:
    """Yield each generated token, steering prefill and every decode step, reading `reads`."""
    params = sampling_params(params)
    check_generation_length(len(ids), params.max_new_tokens, admission.max_positions)
    session = Session(hf_model, reads, admission.writes(steering, [ids]))
    device = next(hf_model.parameters()).device
    gen = sampling.make_generator(params, device)
    eos = admission.eos_ids() if params.stop_at_eos else set()
    inputs = torch.tensor([ids], dtype=torch.long, device=device)
    past: Any = None
    position = 0
    for _ in range(params.max_new_tokens):
        session.offset = position
        session.batch_shape = (1, inputs.shape[1])
        with torch.no_grad(), session:
            out = hf_model(input_ids=inputs, past_key_values=past, use_cache=True)
            logits = out.logits[0, -1]
            token = sampling.next_token(logits, params, gen)
            logprobs = None
            if params.logprobs is not None:
                logprobs = step_logprobs(logits, token, params.logprobs)
        past = out.past_key_values
        position += inputs.shape[1]
        yield DecodeStep(token, logprobs, {r.address: session.captured[r.address] for r in reads})
        if token in eos:
            return
        inputs = torch.tensor([[token]], dtype=torch.long, device=device)
