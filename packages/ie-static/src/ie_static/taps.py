"""Installing taps on a loaded vLLM model, before vLLM compiles it or captures graphs.

Where a point lives (module, input or output, how its tensor is read and written back) comes from
ie-vllm's resolver, so a static tap sees exactly what the hooked backend's hook sees. Instead of a
Python hook, each tapped module's class is swapped for a subclass whose `forward` runs the original
and routes the point through the tap ops; Dynamo inlines that `forward`, so the ops land in the
compiled graph (and in CUDA graphs) as opaque calls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from ie_vllm import SiteDef
from torch import nn

from ie_static import ops  # noqa: F401  (registers torch.ops.ie_static.*)
from ie_static.tables import WriteTable


@dataclass
class StepInputs:
    """Tensors shared by every write tap, refreshed by the host side of the worker before a step."""

    positions: torch.Tensor  # the model runner's persistent positions buffer
    row_slot: torch.Tensor  # [R] int32: request slot of each row, -1 = unsteered
    masks: torch.Tensor  # [S, Q, P] bool: prompt positions a slot's mask leaves alone


@dataclass
class Site:
    """One tapped hook site (ie-vllm's site name): a read buffer, a write table, or both."""

    name: str
    where: SiteDef
    step: StepInputs
    buf: torch.Tensor | None = None
    table: WriteTable | None = None
    # A read-only `(hidden, residual)` output: the sum is read without materializing it. Decided
    # here from the site's declared kind, not in `forward`, so Dynamo only sees a constant.
    sum_only: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self.sum_only = self.table is None and self.where.kind == "residual_pair"

    def tap(self, x: torch.Tensor) -> torch.Tensor:
        """Write then read `x` (captures are post-intervention)."""
        if self.table is not None:
            t = self.table
            a, c, v, m, *affine = t.tensors()
            x = torch.ops.ie_static.write_tap(
                x, self.step.positions, self.step.row_slot, a, c, v, m, self.step.masks, *affine
            )
        if self.buf is not None:
            torch.ops.ie_static.read_tap(x, self.buf)
        return x


@dataclass
class ModuleTaps:
    pre: list[Site] = field(default_factory=list)
    post: list[Site] = field(default_factory=list)


def _tapped_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    taps: ModuleTaps = self._ie_static_taps  # type: ignore[assignment]
    inner = cast(Callable[..., Any], self._ie_static_inner)
    for site in taps.pre:
        new = site.tap(site.where.read(args, kwargs, None))
        if site.table is not None:
            args, kwargs = site.where.write(args, kwargs, None, new)  # type: ignore[misc]
    out = inner(self, *args, **kwargs)
    for site in taps.post:
        if site.sum_only and isinstance(out, tuple):
            torch.ops.ie_static.read_sum_tap(out[0], out[1], site.buf)
            continue
        new = site.tap(site.where.read(args, kwargs, out))
        if site.table is not None:
            out = site.where.write(args, kwargs, out, new)  # type: ignore[misc]
    return out


_SWAPPED: dict[type, type] = {}


def _swap_class(module: nn.Module) -> None:
    """Give `module` a subclass of its class whose forward taps (one subclass per class).

    The tapped forward runs the forward the module ran before: its class's, or one bound on the
    instance, which would otherwise shadow the class's (vLLM's Transformers backend binds a
    rewritten forward on HF attention and MLP modules whose projections it fuses).
    """
    base = type(module)
    if base in _SWAPPED.values():
        return
    bound = module.__dict__.pop("forward", None)
    module._ie_static_inner = bound.__func__ if bound is not None else base.forward  # type: ignore[assignment]
    if base not in _SWAPPED:
        # The subclass keeps the family's class name: the resolver's refusals name the module's
        # class, and a reason must read the same on vllm-static as on hooked vLLM.
        body = {"forward": _tapped_forward, "__qualname__": base.__qualname__}
        _SWAPPED[base] = type(base.__name__, (base,), body)
    module.__class__ = _SWAPPED[base]


@dataclass
class ModelTaps:
    """Everything installed on one model: sites by site name, and the shared step inputs."""

    step: StepInputs
    sites: dict[str, Site] = field(default_factory=dict)

    def read_sites(self) -> dict[str, Site]:
        return {a: s for a, s in self.sites.items() if s.buf is not None}

    def write_sites(self) -> dict[str, Site]:
        return {a: s for a, s in self.sites.items() if s.table is not None}


def _reads_only(site: Site) -> bool:
    return site.table is None


def install(sites: Iterable[Site], step: StepInputs) -> ModelTaps:
    """Install `sites` on their modules (before the model's first forward).

    On each module the write sites run before the read-only ones: two sites may see one tensor
    (`k_rot` and the `attn_k` that attention maps are recomputed from, Granite's `attn_out` and
    its scaled `attn_out_post`), and a read is of the tensor after every write.
    """
    installed = ModelTaps(step=step)
    per_module: dict[int, tuple[nn.Module, ModuleTaps]] = {}
    for site in sorted(sites, key=_reads_only):
        module = site.where.module
        _, taps = per_module.setdefault(id(module), (module, ModuleTaps()))
        (taps.pre if site.where.hook == "pre" else taps.post).append(site)
        installed.sites[site.name] = site
    for module, taps in per_module.values():
        module._ie_static_taps = taps  # type: ignore[assignment]
        _swap_class(module)
    return installed
