"""Activation patching on any backend: metrics of the final logits, mean activations, and sweeps.

A sweep is many independent requests, one per cell, each the corrupt prompt with one `Patch` from
the clean run; they are all in flight together, so vLLM batches them (eager runs them in turn).
Each cell's final logits come from its last-layer residual row through the backend's own lens
(`decode_residuals`: final norm, unembed, the family's multiplier and softcap), so only
`[d_model]` per cell leaves a vLLM worker before the decode. Importing this module imports torch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ie_core.address import to_address
from ie_core.errors import BadPromptError, SteeringSpecError
from ie_core.interventions import Patch
from ie_core.peer_names import point_name
from ie_core.points import Width, get_point
from ie_core.protocol import InterpModel, ModelLike, Prompt, unwrap
from ie_core.runner import run
from ie_core.steering import PositionMask, Steering

TokenLike = int | str
# Cells decoded per lens call: bounds the [cells, vocab] logits held at once.
DECODE_CHUNK = 64


@dataclass(frozen=True)
class Metric:
    """A function of the final-position logits: `fn(logits [n, vocab] fp32, ids) -> [n]`, where
    `ids` are `tokens` as token ids (a string token must be exactly one token)."""

    name: str
    fn: Callable[[torch.Tensor, tuple[int, ...]], torch.Tensor]
    tokens: tuple[TokenLike, ...] = ()

    def token_ids(self, model: Any) -> tuple[int, ...]:
        return tuple(single_token(model, t) for t in self.tokens)


def single_token(model: Any, token: TokenLike) -> int:
    """A token id, or the one id a string encodes to (without BOS); anything else is refused."""
    if isinstance(token, bool) or not isinstance(token, int | str):
        raise SteeringSpecError(f"a metric token is an int id or a string, got {token!r}")
    if isinstance(token, int):
        return token
    ids = model.to_tokens(token, prepend_bos=False)
    if len(ids) != 1:
        raise SteeringSpecError(
            f"{token!r} is {len(ids)} tokens {list(ids)} on this tokenizer; a metric token must "
            "be one token: pass its id, or a string that encodes to one (mind a leading space)"
        )
    return int(ids[0])


def logit_diff(answer: TokenLike, wrong: TokenLike) -> Metric:
    """logit[answer] - logit[wrong] at the last position (equal to the log-prob difference)."""
    return Metric(
        "logit_diff", lambda logits, ids: logits[:, ids[0]] - logits[:, ids[1]], (answer, wrong)
    )


def answer_prob(answer: TokenLike) -> Metric:
    """softmax(logits)[answer] at the last position, from an fp32 logsumexp over the vocab."""
    return Metric(
        "answer_prob",
        lambda logits, ids: torch.exp(logits[:, ids[0]] - torch.logsumexp(logits, dim=-1)),
        (answer,),
    )


@dataclass(frozen=True)
class SweepResult:
    """`values[i, j]`: the metric of the corrupt run patched at `rows[i]` (a layer) and `cols[j]`
    (a position, or a head for per-head points), beside the unpatched clean and corrupt runs."""

    point: str
    rows: tuple[int, ...]
    cols: tuple[int, ...]
    col_kind: str  # "position" | "head"
    values: torch.Tensor = field(compare=False)
    clean: float
    corrupt: float

    def normalized(self) -> torch.Tensor:
        """(values - corrupt) / (clean - corrupt): 1 where the patch restores the clean answer."""
        span = self.clean - self.corrupt
        if span == 0:
            raise ValueError("the clean and corrupt runs score the same; nothing to normalize")
        return (self.values - self.corrupt) / span


async def final_logits(
    model: ModelLike, prompts: Sequence[Prompt], steerings: Sequence[Steering | None]
) -> torch.Tensor:
    """`[n, vocab]` fp32 logits at the last position of each (prompt, steering) request, every
    request in flight at once; the model's own lens turns the last residual row into logits."""
    model = unwrap(model)
    last = f"resid_post.{model.n_layers - 1}"

    async def one(prompt: Prompt, steering: Steering | None) -> torch.Tensor:
        cache = await model.capture([prompt_token_ids(model, prompt)], [last], steering=steering)
        return cache[last][0, -1]

    rows = await asyncio.gather(*(one(p, s) for p, s in zip(prompts, steerings, strict=True)))
    return await decode_rows(model, torch.stack(list(rows)))


async def decode_rows(model: ModelLike, rows: torch.Tensor) -> torch.Tensor:
    """`[n, vocab]` fp32 logits of residual rows `[n, d_model]` through the model's lens,
    `DECODE_CHUNK` rows per call."""
    model = unwrap(model)
    parts = [
        await model.decode_residuals(rows[i : i + DECODE_CHUNK])
        for i in range(0, rows.shape[0], DECODE_CHUNK)
    ]
    return torch.cat(parts).float()


def prompt_token_ids(model: ModelLike, prompt: Prompt) -> list[int]:
    """One prompt's token ids: a string through the model's tokenizer, else the ids as ints."""
    if isinstance(prompt, str):
        return list(unwrap(model).to_tokens(prompt))
    return [int(t) for t in prompt]


async def mean_activation_async(
    model: ModelLike,
    prompts: Sequence[Prompt],
    address: str,
    positions: Sequence[int] | None = None,
) -> torch.Tensor:
    """The mean `[width]` row of `address` over `prompts` (and `positions`, default all): the
    value a mean ablation writes with `Patch(mean)`."""
    model = unwrap(model)
    address = str(to_address(address, check=True))
    if not prompts:
        raise BadPromptError("mean_activation needs at least one prompt")

    async def rows(prompt: Prompt) -> torch.Tensor:
        t = (await model.capture([prompt_token_ids(model, prompt)], [address]))[address][0]
        return t if positions is None else t[list(positions)]

    return torch.cat(await asyncio.gather(*(rows(p) for p in prompts))).float().mean(0)


def mean_activation(
    model: ModelLike,
    prompts: Sequence[Prompt],
    address: str,
    positions: Sequence[int] | None = None,
) -> torch.Tensor:
    return run(mean_activation_async(unwrap(model), prompts, address, positions))


def _cells(
    point: str, layers: Sequence[int], cols: Sequence[int], per_head: bool
) -> list[tuple[int, int]]:
    if per_head and get_point(point).width not in (Width.H, Width.KV):
        raise SteeringSpecError(f"{point} is not a per-head point")
    return [(layer, c) for layer in layers for c in cols]


async def head_count(model: InterpModel, point: str, layer: int, prompt: list[int]) -> int:
    """Heads of a per-head point: the query heads (from attn_probs), scaled for KV-wide points."""
    probs = (await model.capture([prompt], [f"attn_probs.{layer}"]))[f"attn_probs.{layer}"]
    heads = int(probs.shape[1])
    if get_point(point).width == Width.KV:
        z, v = model.point_width(f"z.{layer}"), model.point_width(f"{point}.{layer}")
        heads = heads * v // z
    return heads


async def patch_sweep_async(
    model: ModelLike,
    clean: Prompt,
    corrupt: Prompt,
    *,
    metric: Metric,
    point: str = "resid_pre",
    layers: Sequence[int] | None = None,
    positions: Sequence[int] | None = None,
    heads: bool = False,
) -> SweepResult:
    """Patch the clean run's `point` into the corrupt run, one cell per (layer, position), or per
    (layer, head) with `heads=True` (every position of that head patched); see `SweepResult`.
    `point` is our name or a TransformerLens / nnterp one (`hook_resid_pre`, `attn.hook_z`)."""
    model = unwrap(model)
    point = point_name(point)
    clean_ids, corrupt_ids = prompt_token_ids(model, clean), prompt_token_ids(model, corrupt)
    if len(clean_ids) != len(corrupt_ids):
        raise BadPromptError(
            f"clean and corrupt prompts have {len(clean_ids)} and {len(corrupt_ids)} tokens; "
            "patching pairs positions, so they must be the same length"
        )
    layers = tuple(range(model.n_layers) if layers is None else layers)
    seq = len(clean_ids)
    ids = metric.token_ids(model)
    if heads:
        n_heads = await head_count(model, point, layers[0], corrupt_ids)
        cols = tuple(range(n_heads))
    else:
        cols = tuple(range(seq) if positions is None else positions)
    cells = _cells(point, layers, cols, heads)
    addresses = sorted({f"{point}.{layer}" for layer in layers})
    source = await model.capture([clean_ids], addresses)
    steerings: list[Steering | None] = [None, None]
    for layer, c in cells:
        address = f"{point}.{layer}"
        if heads:
            width = model.point_width(address)
            op = Patch.from_cache(
                source, address, range(seq), heads=(c,), head_dim=width // len(cols)
            )
        else:
            op = Patch.from_cache(source, address, (c,))
        steerings.append(Steering(point, (layer,), (op,), PositionMask()))
    prompts = [clean_ids] + [corrupt_ids] * (len(steerings) - 1)
    logits = await final_logits(model, prompts, steerings)
    scores = metric.fn(logits, ids).float().cpu()
    return SweepResult(
        point=point,
        rows=layers,
        cols=cols,
        col_kind="head" if heads else "position",
        values=scores[2:].reshape(len(layers), len(cols)),
        clean=float(scores[0]),
        corrupt=float(scores[1]),
    )


def patch_sweep(model: ModelLike, clean: Prompt, corrupt: Prompt, **kw: Any) -> SweepResult:
    """Synchronous `patch_sweep_async` (see there), for scripts and notebooks."""
    return run(patch_sweep_async(unwrap(model), clean, corrupt, **kw))


__all__ = [
    "Metric",
    "SweepResult",
    "answer_prob",
    "decode_rows",
    "final_logits",
    "logit_diff",
    "mean_activation",
    "mean_activation_async",
    "patch_sweep",
    "patch_sweep_async",
    "prompt_token_ids",
    "single_token",
]
