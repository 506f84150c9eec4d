"""Dictionary (SAE / transcoder) maths, shared by the host and every worker: encode, decode and
the top-k reduction, from plain tensors and a small `DictMeta`, so a worker needs no loader.

Conventions (SAELens's): `W_enc` `[d_in, d_sae]`, `b_enc` `[d_sae]`, `W_dec` `[d_sae, d_out]`,
`b_dec` `[d_out]`, `threshold` `[d_sae]` (JumpReLU). Everything is computed in fp32.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

ACTIVATIONS = ("relu", "jumprelu", "topk")
NORMALIZATIONS = ("none", "layer_norm")
_LN_EPS = 1e-5


@dataclass(frozen=True)
class DictMeta:
    """What the encode needs beyond the tensors: the activation, TopK's k, whether `b_dec` is
    subtracted from the input first, and the input normalisation."""

    activation: str
    k: int | None = None
    b_dec_in: bool = False
    normalize: str = "none"

    def to_dict(self) -> dict[str, object]:
        return {
            "activation": self.activation,
            "k": self.k,
            "b_dec_in": self.b_dec_in,
            "normalize": self.normalize,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> DictMeta:
        k = data.get("k")
        return cls(
            str(data["activation"]),
            None if k is None else int(k),  # type: ignore[call-overload]
            bool(data.get("b_dec_in", False)),
            str(data.get("normalize", "none")),
        )


def normalized(x: torch.Tensor, meta: DictMeta) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The encoder's input and the (mean, std) that decode multiplies back (0, 1 without one)."""
    x = x.float()
    if meta.normalize == "layer_norm":
        mu = x.mean(-1, keepdim=True)
        std = (x - mu).std(-1, keepdim=True)
        return (x - mu) / (std + _LN_EPS), mu, std + _LN_EPS
    return x, torch.zeros((), device=x.device), torch.ones((), device=x.device)


def pre_acts(x: torch.Tensor, w: Mapping[str, torch.Tensor], meta: DictMeta) -> torch.Tensor:
    """`(x [- b_dec]) @ W_enc + b_enc` on the normalised input, fp32 `[..., d_sae]`."""
    h, _, _ = normalized(x, meta)
    if meta.b_dec_in:
        h = h - w["b_dec"].float()
    return h @ w["W_enc"].float() + w["b_enc"].float()


def activate(pre: torch.Tensor, w: Mapping[str, torch.Tensor], meta: DictMeta) -> torch.Tensor:
    """The dictionary's nonlinearity on pre-activations (dense `[..., d_sae]`)."""
    if meta.activation == "relu":
        return torch.relu(pre)
    if meta.activation == "jumprelu":
        return torch.relu(pre) * (pre > w["threshold"].float())
    if meta.activation == "topk":
        assert meta.k is not None
        vals, ids = torch.topk(pre, min(meta.k, pre.shape[-1]), dim=-1)
        return torch.zeros_like(pre).scatter(-1, ids, torch.relu(vals))
    raise ValueError(f"unknown activation {meta.activation!r}; use one of {ACTIVATIONS}")


def encode(x: torch.Tensor, w: Mapping[str, torch.Tensor], meta: DictMeta) -> torch.Tensor:
    """Feature activations `[..., d_sae]` (fp32) of rows `x` `[..., d_in]`."""
    return activate(pre_acts(x, w, meta), w, meta)


def decode(
    acts: torch.Tensor,
    w: Mapping[str, torch.Tensor],
    mu: torch.Tensor | None = None,
    std: torch.Tensor | None = None,
) -> torch.Tensor:
    """`acts @ W_dec + b_dec`, de-normalised by the input's (mean, std) when given."""
    out = acts.float() @ w["W_dec"].float() + w["b_dec"].float()
    if std is not None:
        out = out * std
    if mu is not None:
        out = out + mu
    return out


def reconstruct(x: torch.Tensor, w: Mapping[str, torch.Tensor], meta: DictMeta) -> torch.Tensor:
    """decode(encode(x)) in x's own scale (fp32)."""
    _, mu, std = normalized(x, meta)
    return decode(encode(x, w, meta), w, mu, std)


def topk_features(acts: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest activations per row: (ids int64, values fp32), largest first."""
    vals, ids = torch.topk(acts, min(k, acts.shape[-1]), dim=-1)
    return ids, vals


def reduce_rows(
    x: torch.Tensor, w: Mapping[str, torch.Tensor], meta: DictMeta, k: int | None, stats: bool
) -> dict[str, torch.Tensor]:
    """What a worker ships for rows `x`: dense `acts`, or top-k `ids` / `values`; with `stats`
    the per-row squared reconstruction error `sq_error` and centred squared norm `sq_norm`
    (fraction of variance explained = 1 - sq_error / sq_norm)."""
    acts = encode(x, w, meta)
    out: dict[str, torch.Tensor] = {}
    if k is None:
        out["acts"] = acts
    else:
        out["ids"], out["values"] = topk_features(acts, k)
    if stats:
        _, mu, std = normalized(x, meta)
        xf = x.float()
        out["sq_error"] = (xf - decode(acts, w, mu, std)).pow(2).sum(-1)
        out["sq_norm"] = (xf - xf.mean(-1, keepdim=True)).pow(2).sum(-1)
    return out


__all__ = [
    "ACTIVATIONS",
    "NORMALIZATIONS",
    "DictMeta",
    "activate",
    "decode",
    "encode",
    "normalized",
    "pre_acts",
    "reconstruct",
    "reduce_rows",
    "topk_features",
]
