"""Logit lens with the model's own modules: final norm, unembed, then the family's logit
multiplier (Granite divides by `logits_scaling`, Cohere multiplies by `logit_scale`) and final
softcap `c * tanh(x / c)`, in that order."""

from __future__ import annotations

from typing import Any, Protocol

import torch
from ie_core.errors import PointUnavailableError
from ie_core.protocol import TopK
from ie_core.reduce import LensTopK

from ie_eager.structure import Structure

__all__ = ["LensModel", "decode", "logit_transform", "topk"]


class LensModel(Protocol):
    """The parts of a loaded model the lens reads (an `EagerModel` has them): its found modules
    and shapes, where its weights live, and the config facts of the post-unembed transform."""

    @property
    def model_id(self) -> str: ...

    @property
    def structure(self) -> Structure: ...

    @property
    def d_model(self) -> int: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def text_config(self) -> Any: ...


def _rows(model: LensModel, rows: Any) -> torch.Tensor:
    t = rows if isinstance(rows, torch.Tensor) else torch.as_tensor(rows)
    streams = model.structure.n_streams * model.d_model
    if t.shape[-1] != model.d_model and not (
        model.structure.multi_stream and t.shape[-1] == streams
    ):
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


def _collapse_streams(model: LensModel, h: torch.Tensor) -> torch.Tensor:
    """Multi-stream trunks (DeepSeek-V4): `[..., n_streams * d_model]` rows (resid_streams) are
    collapsed to one d_model row by the model's own head (hc_head: sigmoid weights computed from
    the normed streams, then a weighted sum over streams), exactly as before its final norm.
    d_model rows (one stream, a collapse point) pass unchanged."""
    s = model.structure
    if not s.multi_stream or h.shape[-1] == model.d_model:
        return h
    if s.stream_head is None:
        raise PointUnavailableError(f"{model.model_id} has no stream head to collapse streams")
    lead = h.shape[:-1]
    stack = h.reshape(-1, 1, s.n_streams, model.d_model)
    return s.stream_head[1](stack).reshape(*lead, model.d_model)


def decode(model: LensModel, rows: Any, *, grad: bool = False) -> torch.Tensor:
    """`[..., d_model]` residual rows -> `[..., vocab]` logits as the model would compute them."""
    h = _rows(model, rows)
    if model.structure.final_norm is None:
        raise PointUnavailableError(
            f"{model.model_id} has no final norm module the lens could apply; decode manually"
        )
    with torch.enable_grad() if grad else torch.no_grad():
        h = _collapse_streams(model, h)
        normed = model.structure.final_norm[1](h)
        logits = model.structure.lm_head[1](normed)
        return logit_transform(model.text_config, logits)


def topk(model: LensModel, rows: Any, k: int = 10) -> TopK:
    """Top-k ids and probabilities, the probabilities from an fp32 logsumexp over the full vocab
    (the `LensTopK` reducer's maths, on this model's logits)."""
    got = LensTopK(k).of_logits(decode(model, rows))
    return TopK(ids=got["ids"], probs=got["probs"])
