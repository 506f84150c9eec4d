"""Computing the Jacobian lens on eager with autograd.

For one prompt of T tokens the forward runs on T copies of it; in copy t the residual of layer L
at position t is replaced by a leaf (same values), so the final residual at t depends on that leaf
only through position t. One batched backward over the d_model output units then gives every
same-position block d resid_final[t] / d resid_L[t] at once; the lens averages them over all rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from ie_core.errors import PointUnavailableError
from ie_core.experiments.jacobian_lens import JacobianLens
from ie_core.protocol import prompt_batch

if TYPE_CHECKING:
    from ie_eager.backend import EagerModel
    from ie_eager.resolve import Tap

__all__ = ["jacobian_lens", "position_jacobians"]


def _hook(tap: Tap, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """Install `fn` on a tap's tensor (rows `[batch, seq, d]`); returns the hook handle."""

    def apply(raw: torch.Tensor) -> torch.Tensor:
        return tap.select.put(raw, fn(tap.select.get(raw)))

    if tap.io == "in":

        def pre(_m: Any, args: tuple, kwargs: dict) -> Any:
            if args:
                return (apply(args[0]), *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": apply(kwargs["hidden_states"])}

        return tap.module.register_forward_pre_hook(pre, with_kwargs=True)

    def post(_m: Any, _args: tuple, _kwargs: dict, output: Any) -> Any:
        if isinstance(output, torch.Tensor):
            return apply(output)
        items = list(output)
        items[tap.item] = apply(items[tap.item])
        return type(output)(items)

    return tap.module.register_forward_hook(post, with_kwargs=True)


def _resid_tap(model: EagerModel, layer: int) -> Tap:
    r = model.resolver.resolve(f"resid_post.{layer}")
    if r.kind != "tap" or r.scale is not None:
        raise PointUnavailableError(
            f"resid_post.{layer} of {model.model_id} is derived, not one tensor the lens can "
            "differentiate through"
        )
    return r.tap


def position_jacobians(model: EagerModel, ids: Sequence[int], layer: int) -> torch.Tensor:
    """`[T, d, d]`: d resid_final[t] / d resid_post.layer[t] for each position t of one prompt."""
    last = model.n_layers - 1
    n, d = len(ids), model.d_model
    if layer == last:
        return torch.eye(d).expand(n, d, d).clone()
    pos = torch.arange(n, device=model.device)
    leaves: list[torch.Tensor] = []
    finals: list[torch.Tensor] = []

    def swap(h: torch.Tensor) -> torch.Tensor:
        leaf = h.detach()[pos, pos].clone().requires_grad_(True)
        leaves.append(leaf)
        return h.detach().index_put((pos, pos), leaf)

    def keep(h: torch.Tensor) -> torch.Tensor:
        finals.append(h)
        return h

    handles = [_hook(_resid_tap(model, layer), swap), _hook(_resid_tap(model, last), keep)]
    batch = torch.tensor([list(ids)] * n, dtype=torch.long, device=model.device)
    try:
        with torch.enable_grad():
            # The trunk only: the logits are not needed and cost the most on a big vocab.
            trunk = getattr(model.hf_model, "base_model", model.hf_model)
            trunk(input_ids=batch, use_cache=False)
            out = finals[-1][pos, pos]  # [T, d]: position t of copy t
            units = torch.eye(d, dtype=out.dtype, device=out.device)
            grads = torch.autograd.grad(
                out, leaves[-1], units[:, None, :].expand(d, n, d), is_grads_batched=True
            )[0]
    finally:
        for h in handles:
            h.remove()
    return grads.permute(1, 0, 2).float().cpu()  # [T, i (final), j (layer)]


def jacobian_lens(
    model: EagerModel, prompts: Any, layers: Sequence[int] | None = None
) -> JacobianLens:
    """The average same-position Jacobian per layer over every token row of `prompts`."""
    if model.structure.multi_stream:
        raise PointUnavailableError(
            f"{model.model_id} has a multi-stream residual; the Jacobian lens transports one "
            "d_model stream"
        )
    chosen = list(range(model.n_layers)) if layers is None else list(layers)
    for layer in chosen:
        model.resolver.resolve(f"resid_post.{layer}")  # a bad layer raises its named error
    rows = [list(p) for p in prompt_batch(prompts, model.to_tokens, model.structure.shapes.vocab)]
    sums = {layer: torch.zeros(model.d_model, model.d_model) for layer in chosen}
    count = sum(len(r) for r in rows)
    for ids in rows:
        for layer in chosen:
            sums[layer] += position_jacobians(model, ids, layer).sum(0)
    matrices = {layer: s / count for layer, s in sums.items()}
    return JacobianLens(model.model_id, model.n_layers, model.d_model, matrices, count)
