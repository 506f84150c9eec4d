"""Your own functions at points (`run_with_hooks`, `generate_with_hooks`) and attribution patching.

A hook is a `Hook` op, so it rides the steering machinery: run in the forward's order with the
other writes, per request, removed when the request ends (even on error), and isolated from
concurrent requests as steering is. Backends whose forward runs in other processes refuse it.
Importing this module imports torch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ie_core.cache import ActivationCache
from ie_core.errors import SteeringSpecError
from ie_core.experiments.patching import Metric, SweepResult, head_count, prompt_token_ids
from ie_core.grammar import AddressLike, Width, get_point, point_name, to_address
from ie_core.ops import Hook, Steering, steer_at
from ie_core.protocol import Generation, Prompt, SamplingParams
from ie_core.runner import run
from ie_core.sync import ModelLike, unwrap

HookFn = Callable[[torch.Tensor, str | None], torch.Tensor | None]
HookList = Sequence[tuple[AddressLike, HookFn]]


def hook_steering(hooks: HookList) -> tuple[Steering, ...]:
    """One spec per `(address, fn)`; each fn is told its address (our name for the point)."""
    specs = []
    for address, fn in hooks:
        addr = to_address(address, check=True)
        specs.append(steer_at(addr, Hook(fn, str(addr))))
    return tuple(specs)


def run_with_hooks(
    model: ModelLike,
    tokens: Prompt | Sequence[Sequence[int]],
    hooks: HookList,
    addresses: Sequence[AddressLike] = (),
) -> ActivationCache:
    """One forward with `fn(tensor, address)` run at each address; returns `addresses` captured
    after the hooks (add `"lm_head"` for the logits)."""
    return run(unwrap(model).capture(tokens, list(addresses), steering=hook_steering(hooks)))


def generate_with_hooks(
    model: ModelLike,
    prompt: Prompt,
    hooks: HookList,
    *,
    max_new_tokens: int = 32,
    **sampling: Any,
) -> Generation:
    """Generate with the hooks run on the prompt's forward and every decode step."""
    params = SamplingParams(max_new_tokens=max_new_tokens, **sampling)
    return run(unwrap(model).generate(prompt, params, steering=hook_steering(hooks)))


async def attribution_patch_async(
    model: ModelLike,
    clean: Prompt,
    corrupt: Prompt,
    *,
    metric: Metric,
    point: str = "resid_pre",
    layers: Sequence[int] | None = None,
    heads: bool = False,
) -> SweepResult:
    """The linear estimate of every (layer, position) patch from one forward and one backward:
    `(clean - corrupt) . d metric / d activation` on the corrupt run (needs autograd: eager).

    The gradient is taken through a zero offset added at each address by a `Hook`, so it is the
    gradient at the activation the model uses, after every other write. `point` is our name or
    a TransformerLens / nnterp one (`hook_resid_pre`). `heads=True` (a per-head point: `z`,
    `value`, the q/k norm points) gives `values` as [layers, positions, heads], each head's share
    of the dot product; summed over heads it is the `heads=False` result."""
    model = unwrap(model)
    point = point_name(point)
    if heads and get_point(point).width not in (Width.H, Width.KV):
        raise SteeringSpecError(f"{point} is not a per-head point; heads=True needs z, value, ...")
    clean_ids, corrupt_ids = prompt_token_ids(model, clean), prompt_token_ids(model, corrupt)
    if len(clean_ids) != len(corrupt_ids):
        raise ValueError(
            f"clean and corrupt prompts have {len(clean_ids)} and {len(corrupt_ids)} tokens; "
            "attribution pairs positions, so they must be the same length"
        )
    layers = tuple(range(model.n_layers) if layers is None else layers)
    addresses = [f"{point}.{layer}" for layer in layers]
    both = await asyncio.gather(
        model.capture([clean_ids], addresses), model.capture([corrupt_ids], addresses)
    )
    clean_cache, corrupt_cache = both
    offsets = {a: torch.zeros_like(corrupt_cache[a].float(), requires_grad=True) for a in addresses}

    def add_offset(x: torch.Tensor, address: str | None) -> torch.Tensor:
        return x + offsets[str(address)].to(x.device)

    last = f"resid_post.{model.n_layers - 1}"
    steering = hook_steering([(a, add_offset) for a in addresses])
    cache = await model.capture([corrupt_ids], [last], steering=steering, grad=True)  # type: ignore[call-arg]
    logits = await model.decode_residuals(cache[last][:, -1], grad=True)  # type: ignore[call-arg]
    ids = metric.token_ids(model)
    clean_logits = await model.decode_residuals(
        (await model.capture([clean_ids], [last]))[last][:, -1]
    )
    score = metric.fn(logits.float(), ids)
    # Gradients of the offsets only: backward() would also leave .grad on the model's weights.
    grads = torch.autograd.grad(score.sum(), [offsets[a] for a in addresses], allow_unused=True)
    rows = []
    for a, grad in zip(addresses, grads, strict=True):
        if grad is None:
            raise RuntimeError(f"no gradient reached {a}; the metric does not depend on it")
        product = ((clean_cache[a] - corrupt_cache[a]).float() * grad)[0]  # [seq, width]
        if heads:
            count = await head_count(model, point, to_address(a).layer or 0, corrupt_ids)
            rows.append(product.reshape(product.shape[0], count, -1).sum(-1))  # [seq, heads]
        else:
            rows.append(product.sum(-1))
    corrupt_score = float(score.detach()[0])
    return SweepResult(
        point=point,
        rows=layers,
        cols=tuple(range(len(corrupt_ids))),
        col_kind="position",
        values=corrupt_score + torch.stack(rows).detach().cpu(),
        clean=float(metric.fn(clean_logits.float(), ids)[0]),
        corrupt=corrupt_score,
    )


def attribution_patch(model: ModelLike, clean: Prompt, corrupt: Prompt, **kw: Any) -> SweepResult:
    """Synchronous `attribution_patch_async`: estimates in the units of `patch_sweep`'s values."""
    return run(attribution_patch_async(unwrap(model), clean, corrupt, **kw))


__all__ = [
    "HookFn",
    "attribution_patch",
    "attribution_patch_async",
    "generate_with_hooks",
    "hook_steering",
    "run_with_hooks",
]
