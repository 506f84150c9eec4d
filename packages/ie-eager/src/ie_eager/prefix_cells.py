"""Many steered requests on one prompt, each computed from the first position its ops can change.

A request whose ops write nothing before position p (a patch at p) sees, at every position before
p and in every layer, exactly the unsteered prompt's rows (a causal model's position p reads only
positions <= p). So the requests of one prompt that start at p share one unsteered forward of the
first p tokens, whose KV cache they continue with the rest of the prompt, batched, steered: a
patching grid computes about half the tokens it would from position 0. Only the final position's
logits of chosen tokens (and the logsumexp over the vocabulary) are kept: `final_token_logits`,
the terminal read-out `patch_sweep` asks for.

Models whose cache is not plain attention keys and values (linear attention, state-space layers)
are run from position 0: their layers need the whole chunk from their own state.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch
from ie_core.errors import BadPromptError
from ie_core.protocol import Prompt, SteeringArg, steering_tuple
from torch import nn
from transformers import DynamicCache

from ie_eager.admission import EagerAdmission
from ie_eager.hooks import Session, Write

__all__ = ["BATCH_ROWS", "final_token_logits", "first_written"]

BATCH_ROWS = 64  # requests continued in one forward: bounds its activations
# Cache layers that hold plain keys and values, which a continued forward extends exactly.
_PLAIN_LAYERS = ("DynamicLayer", "DynamicSlidingWindowLayer")

Start = Callable[[SteeringArg, int], int]


def first_written(steering: SteeringArg, length: int) -> int:
    """The first position any of `steering`'s ops can change (0 where an op may write anywhere),
    at most the prompt's last position, which every request computes."""
    start = length - 1
    for spec in steering_tuple(steering):
        for op in spec.ops:
            start = min(start, op.first_position())
    return max(start, 0)


def final_token_logits(
    hf_model: nn.Module,
    admission: EagerAdmission,
    prompts: Sequence[Prompt],
    steerings: Sequence[SteeringArg],
    token_ids: Sequence[int],
    start: Start = first_written,
) -> tuple[torch.Tensor, torch.Tensor]:
    """For each (prompt, steering), the last position's logits of `token_ids` `[n, k]` and the
    logsumexp over the vocabulary `[n]`, fp32. `start` picks each request's first computed
    position (tests pass a wrong one to show it matters)."""
    if len(steerings) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(steerings)} steerings; give one each")
    ids = [int(i) for i in token_ids]
    if not ids or any(not 0 <= i < admission.vocab for i in ids):
        raise BadPromptError(
            f"token ids must be within the vocabulary [0, {admission.vocab}), got {ids}"
        )
    rows = [admission.prompt_ids(p) for p in prompts]
    admitted: list[list[Write]] = []  # each request's writes, admitted once, before any forward
    groups: dict[tuple[tuple[int, ...], int], list[int]] = {}
    for i, (r, s) in enumerate(zip(rows, steerings, strict=True)):
        admitted.append(admission.row_writes([s], [r]))
        groups.setdefault((tuple(r), start(s, len(r))), []).append(i)
    keep = {"logits_to_keep": 1} if _keeps_logits(hf_model) else {}
    selected = torch.empty(len(rows), len(ids))
    lse = torch.empty(len(rows))
    for (prompt, at), members in groups.items():
        for lo in range(0, len(members), BATCH_ROWS):
            chunk = members[lo : lo + BATCH_ROWS]
            writes = [admitted[i] for i in chunk]
            logits = _continue(hf_model, list(prompt), at, writes, keep)
            selected[chunk] = logits[:, ids].cpu()
            lse[chunk] = torch.logsumexp(logits, dim=-1).cpu()
    return selected, lse


def _continue(
    hf_model: nn.Module,
    prompt: list[int],
    at: int,
    row_writes: list[list[Write]],
    keep: dict[str, int],
) -> torch.Tensor:
    """`[len(row_writes), vocab]` fp32 last-position logits, each row steered by its own admitted
    writes (each one row's, of this prompt), the first `at` positions taken from one unsteered
    forward's cache."""
    device = next(hf_model.parameters()).device
    past = _prefix_cache(hf_model, prompt[:at], device) if at else None
    if at and past is None:
        at = 0  # not a plain KV cache: compute every position
    batch = len(row_writes)
    if past is not None:
        past.batch_repeat_interleave(batch)
    # Row b's writes steer batch row b; every row is the same prompt, so its masks repeat.
    writes = [
        replace(w, masked=w.masked * batch, batch_rows=(b,))
        for b, own in enumerate(row_writes)
        for w in own
    ]
    inputs = torch.tensor([prompt[at:]] * batch, dtype=torch.long, device=device)
    session = Session(hf_model, (), writes)
    session.offset, session.batch_shape = at, (batch, inputs.shape[1])
    with torch.no_grad(), session:
        out = hf_model(input_ids=inputs, past_key_values=past, use_cache=past is not None, **keep)
    return out.logits[:, -1].float()


def _prefix_cache(hf_model: nn.Module, prefix: list[int], device: Any) -> DynamicCache | None:
    """The unsteered forward's cache of `prefix`, or None where it is not plain keys and values."""
    with torch.no_grad():
        out = hf_model(input_ids=torch.tensor([prefix], device=device), use_cache=True)
    cache = out.past_key_values
    if type(cache) is not DynamicCache:
        return None
    if any(type(layer).__name__ not in _PLAIN_LAYERS for layer in cache.layers):
        return None
    return cache


def _keeps_logits(hf_model: nn.Module) -> bool:
    """Whether the model's forward takes `logits_to_keep` (only the last row's logits)."""
    return "logits_to_keep" in inspect.signature(hf_model.forward).parameters
