"""What the eval harnesses ask a model, on any backend: continuation log-likelihoods and greedy
continuations cut at stop strings, every request in flight together.

Log-likelihoods come from the model's own residual stream: one capture of the last block's output
over context + continuation, the model's lens (final norm and unembedding, `decode_residuals`) on
the rows that predict the continuation, and an fp32 log-softmax. Steering is passed to each
capture, so the rows (and hence the log-probs) are those of the steered forward.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from ie_core import InterpModel, SamplingParams, Steering
from ie_core.errors import BadPromptError
from ie_core.tl_shaped import last_residual

# Rows per lens call: a SmolLM2 row of logits is 49152 floats, so 64 rows are ~12 MiB.
DECODE_CHUNK = 64


@dataclass(frozen=True)
class Scored:
    """A continuation's summed log-probability and whether greedy decoding would produce it."""

    logprob: float
    is_greedy: bool


async def _rows(model: InterpModel, ids: list[int], steering: Sequence[Steering]) -> torch.Tensor:
    """`[len(ids), d]` last-block rows of one (steered) forward over `ids`."""
    point = last_residual(model)
    cache = await model.capture([ids], [point], steering=tuple(steering) or None)
    rows = cache[point][0]
    return rows.reshape(rows.shape[0], -1)  # several residual streams decode as one row


async def _score(
    model: InterpModel, context: list[int], continuation: list[int], steering: Sequence[Steering]
) -> Scored:
    if not context:
        raise BadPromptError(
            "a continuation is scored after at least one context token (a BOS or EOS for an "
            "empty context); got an empty context"
        )
    if not continuation:
        return Scored(0.0, True)
    rows = await _rows(model, [*context, *continuation], steering)
    n = len(continuation)
    preds = rows[len(context) - 1 : len(context) - 1 + n]
    total, greedy = 0.0, True
    target = torch.tensor(continuation, dtype=torch.long)
    for lo in range(0, n, DECODE_CHUNK):
        logits = (await model.decode_residuals(preds[lo : lo + DECODE_CHUNK])).float().cpu()
        logp = torch.log_softmax(logits, dim=-1)
        want = target[lo : lo + DECODE_CHUNK]
        total += float(logp.gather(1, want[:, None]).sum())
        greedy = greedy and bool((logits.argmax(dim=-1) == want).all())
    return Scored(total, greedy)


async def score_continuations(
    model: InterpModel,
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
    steering: Sequence[Steering] = (),
) -> list[Scored]:
    """sum_j log p(cont_j | context, cont_<j) for each (context ids, continuation ids), every
    request in flight at once (on vLLM they share the engine's batches)."""
    jobs = [_score(model, list(c), list(x), steering) for c, x in pairs]
    return list(await asyncio.gather(*jobs))


def cut_at_stops(text: str, stops: Sequence[str]) -> str:
    """`text` up to (not including) the earliest stop string."""
    cut = len(text)
    for stop in stops:
        if stop:
            at = text.find(stop)
            if at != -1:
                cut = min(cut, at)
    return text[:cut]


async def _continue(
    model: InterpModel,
    ids: list[int],
    sampling: SamplingParams,
    stops: Sequence[str],
    steering: Sequence[Steering],
) -> str:
    out = await model.generate(ids, sampling, steering=tuple(steering) or None)
    return cut_at_stops(out.text, stops)


async def generate_continuations(
    model: InterpModel,
    prompts: Sequence[Sequence[int]],
    sampling: Sequence[SamplingParams],
    stops: Sequence[Sequence[str]],
    steering: Sequence[Steering] = (),
) -> list[str]:
    """Each prompt's continuation text, cut at its first stop string; all in flight at once.

    The backends stop at a token count or EOS, not at strings, so the text is cut afterwards:
    greedy tokens do not depend on later ones, so the kept text is what stopping would give."""
    jobs = [
        _continue(model, list(p), s, t, steering)
        for p, s, t in zip(prompts, sampling, stops, strict=True)
    ]
    return list(await asyncio.gather(*jobs))


def rolling_windows(
    ids: Sequence[int], prefix_token: int, max_length: int
) -> list[tuple[list[int], list[int]]]:
    """(context, continuation) windows that score every token of `ids` exactly once, each with
    as much preceding text as `max_length` positions allow, the first after `prefix_token`."""
    if max_length < 2:
        raise BadPromptError(f"max_length must be at least 2 to score a token, got {max_length}")
    tokens = [prefix_token, *ids]
    out: list[tuple[list[int], list[int]]] = []
    start = 1  # index in `tokens` of the first token not yet scored
    while start < len(tokens):
        stop = min(start + max_length - 1, len(tokens))  # score tokens[start:stop]
        first = max(0, stop - max_length)  # the window's first position
        out.append((tokens[first:start], tokens[start:stop]))
        start = stop
    return out


__all__ = [
    "DECODE_CHUNK",
    "Scored",
    "cut_at_stops",
    "generate_continuations",
    "rolling_windows",
    "score_continuations",
]
