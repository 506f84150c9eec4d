"""Logit lens with the model's own modules: final norm, unembed, then the family's logit
multiplier (Granite divides by `logits_scaling`, Cohere multiplies by `logit_scale`) and final
softcap `c * tanh(x / c)`, in that order."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from ie_core.errors import PointUnavailableError
from ie_core.protocol import TopK

if TYPE_CHECKING:
    from ie_eager.backend import EagerModel


def _rows(model: EagerModel, rows: Any) -> torch.Tensor:
    t = rows if isinstance(rows, torch.Tensor) else torch.as_tensor(rows)
    if t.shape[-1] != model.d_model:
        raise ValueError(f"rows must be [..., d_model={model.d_model}], got shape {tuple(t.shape)}")
    if not torch.isfinite(t).all():
        raise ValueError("rows contain NaN or infinite values")
    return t.to(device=model.device, dtype=model.dtype)


def logit_transform(config: Any, logits: torch.Tensor) -> torch.Tensor:
    """The family's post-unembed transform, read from config facts."""
    scaling = getattr(config, "logits_scaling", None)
    if scaling not in (None, 1.0):
        logits = logits / scaling
    scale = getattr(config, "logit_scale", None)
    if isinstance(scale, int | float) and scale != 1.0:
        logits = logits * scale
    cap = getattr(config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def decode(model: EagerModel, rows: Any) -> torch.Tensor:
    """`[..., d_model]` residual rows -> `[..., vocab]` logits as the model would compute them."""
    h = _rows(model, rows)
    if model.structure.final_norm is None:
        raise PointUnavailableError(
            f"{model.model_id} has no final norm module the lens could apply; decode manually"
        )
    with torch.no_grad():
        normed = model.structure.final_norm[1](h)
        logits = model.structure.lm_head[1](normed)
        return logit_transform(model.text_config, logits)


def topk(model: EagerModel, rows: Any, k: int = 10) -> TopK:
    """Top-k ids and probabilities, the probabilities from an fp32 logsumexp over the full vocab."""
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    logits = decode(model, rows).float()
    flat = logits.reshape(-1, logits.shape[-1])
    k = min(k, flat.shape[-1])
    values, ids = torch.topk(flat, k, dim=-1)
    probs = torch.exp(values - torch.logsumexp(flat, dim=-1, keepdim=True))
    return TopK(ids=ids, probs=probs)
