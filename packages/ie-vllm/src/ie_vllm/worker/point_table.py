"""The point table a resolved model carries: hook sites (`SiteDef`), the attention geometry
scores are recomputed with (`AttnGeom`), and per address its site, width, writability or reason.

`ie_vllm.worker.resolve` builds it from vLLM's module tree; the worker installs its sites as hooks and
ie-static as taps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ie_core.model_info import ModelInfo
from torch import nn

from ie_vllm.worker.access import Reader, Writer

__all__ = ["AttnGeom", "PointTable", "SiteDef"]


@dataclass(frozen=True)
class SiteDef:
    """One hook: `pre` reads (args, kwargs), `post` reads the output; `write` None = read only."""

    name: str
    module: nn.Module
    hook: str  # "pre" | "post"
    read: Reader
    write: Writer | None
    width: int
    # "residual_pair": the hooked tensor is the sum of a `(hidden, residual)` output, which a
    # read-only static tap can read without materializing; "tensor" otherwise.
    kind: str = "tensor"
    # Forward hooks on other modules the read needs, installed with the site (`BranchSum`).
    companions: tuple[tuple[nn.Module, Callable[..., None]], ...] = ()


@dataclass(frozen=True)
class AttnGeom:
    """What recomputing attention scores needs, read from vLLM's attention layer."""

    heads: int
    kv_heads: int
    head_dim: int
    scale: float
    softcap: float
    window: int | None
    alibi: tuple[float, ...] = ()  # per-head ALiBi slopes (BLOOM), added as slope * key position
    # Per-head learned sink logits (gpt-oss): a column each softmax row includes and drops.
    sinks: tuple[float, ...] = ()


@dataclass
class PointTable:
    """Every address this model serves (-> site name) and every refusal (-> reason)."""

    n_layers: int
    d_model: int
    sites: dict[str, SiteDef] = field(default_factory=dict)
    addresses: dict[str, str] = field(default_factory=dict)
    writable: set[str] = field(default_factory=set)
    refused: dict[str, str] = field(default_factory=dict)  # address or bare point name -> reason
    attn: dict[int, AttnGeom] = field(default_factory=dict)
    widths: dict[str, int] = field(default_factory=dict)  # address -> width

    def info(self) -> ModelInfo:
        """What the host needs: shape, widths, writability, refusals, heads per layer."""
        return ModelInfo(
            n_layers=self.n_layers,
            d_model=self.d_model,
            widths=dict(self.widths),
            writable=tuple(sorted(self.writable)),
            refused=dict(self.refused),
            attn_heads={layer: g.heads for layer, g in self.attn.items()},
        )
