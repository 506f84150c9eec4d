"""Residual rows through the final norm and unembed, computed in the worker (`ie_decode`,
`ie_lens_topk`): full logits for small inputs, top-k for any size."""

from __future__ import annotations

from typing import Any

import torch
from ie_core.errors import UnsupportedOperationError
from ie_core.protocol import TopK

from ie_vllm import payload
from ie_vllm.host.model_parts import ModelParts

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
