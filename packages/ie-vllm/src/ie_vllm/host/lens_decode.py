"""Residual rows through the final norm and unembed, computed in the worker (`ie_decode`,
`ie_lens_topk`): full logits for small inputs, top-k for any size; and the final position's
logits of chosen tokens for many steered requests (`final_token_logits`, a terminal reducer), so
a patching sweep's cells return a few numbers each."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from ie_core.errors import BadPromptError, UnsupportedOperationError
from ie_core.protocol import SamplingParams, SteeringArg, TopK

from ie_vllm import payload
from ie_vllm.host.model_parts import ModelParts
from ie_vllm.host.request import gather
from ie_vllm.specs import ReducerSpec

FULL_LOGITS_LIMIT = 64 * 2**20  # bytes of [rows, vocab] fp32 decode_residuals may ship back


def residual_rows(rows: Any, d_model: int) -> tuple[torch.Tensor, tuple[int, ...]]:
    """`[..., d_model]` finite floats as `[n, d_model]`, and the leading shape to restore."""
    t = torch.as_tensor(rows)
    if t.ndim == 0 or t.shape[-1] != d_model:
        raise ValueError(f"residual rows must end in d_model={d_model}, got shape {tuple(t.shape)}")
    if not t.is_floating_point() or not torch.isfinite(t).all():
        raise ValueError("residual rows must be finite floating-point values")
    return t.reshape(-1, d_model).contiguous(), tuple(t.shape[:-1])


async def logits(model: ModelParts, rows: Any) -> torch.Tensor:
    """Full logits `[..., vocab]`; refused above FULL_LOGITS_LIMIT bytes."""
    flat, lead = residual_rows(rows, model.d_model)
    vocab = model.info.vocab_size or len(model.tokenizer)
    size = flat.shape[0] * vocab * 4
    if size > FULL_LOGITS_LIMIT:
        raise UnsupportedOperationError(
            f"decode_residuals would ship {size / 2**20:.0f} MiB of logits back from the "
            f"worker (limit {FULL_LOGITS_LIMIT // 2**20} MiB); use decode_residuals_topk"
        )
    rpc = model.engine.rpc_payload("ie_decode", payload.encode({"rows": flat}), stateless=True)
    out = await model.flow.on_engine(rpc)
    return out["logits"].reshape(*lead, out["logits"].shape[-1])


async def topk(model: ModelParts, rows: Any, k: int) -> TopK:
    """Top-k ids and full-vocab probabilities, `[..., k]`."""
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    flat, lead = residual_rows(rows, model.d_model)
    rpc = model.engine.rpc_payload(
        "ie_lens_topk", payload.encode({"rows": flat}), k, stateless=True
    )
    out = await model.flow.on_engine(rpc)
    return TopK(out["ids"].reshape(*lead, k), out["probs"].reshape(*lead, k))


__all__ = ["FULL_LOGITS_LIMIT", "logits", "residual_rows", "topk"]


async def final_token_logits(
    model: ModelParts,
    prompts: Sequence[Any],
    steerings: Sequence[SteeringArg],
    token_ids: Sequence[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """For each (prompt, steering) request, the last position's logits of `token_ids` `[n, k]`
    and the logsumexp over the vocabulary `[n]`, fp32: the worker's lens runs on that one row
    (`token_logits` reducer) and only these numbers cross; every request is in flight at once."""
    model.admission.require_points("final_token_logits")
    if len(steerings) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(steerings)} steerings; give one each")
    vocab = model.admission.vocab()
    ids = [int(i) for i in token_ids]
    if not ids or any(not 0 <= i < vocab for i in ids):
        raise BadPromptError(f"token ids must be within the vocabulary [0, {vocab}), got {ids}")
    (last,) = model.admission.captures([f"resid_post.{model.info.n_layers - 1}"])
    one = SamplingParams(max_new_tokens=1, stop_at_eos=False)

    async def cell(prompt: Any, steering: SteeringArg) -> dict[str, torch.Tensor]:
        prompt_ids = model.admission.prompt_ids(prompt)
        model.admission.check_length(prompt_ids, 1)
        steer = model.admission.steer_specs(steering, prompt_ids)
        params = {"ids": ids, "position": len(prompt_ids) - 1}
        reducer = ReducerSpec("final", "token_logits", last, params)
        _, rows = await model.flow.run(prompt_ids, one, (), steer, reducers=(reducer,))
        return rows

    async def every_cell() -> list[dict[str, torch.Tensor]]:
        return await gather(*(cell(p, s) for p, s in zip(prompts, steerings, strict=True)))

    got = await model.flow.on_engine(every_cell())
    selected = torch.cat([g["final|selected"].float().cpu() for g in got])
    lse = torch.cat([g["final|lse"].float().cpu() for g in got])
    return selected, lse
