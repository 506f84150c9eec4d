"""LoRA adapters on eager, per request: each adapter is read and checked once per model
(`Adapters`), and `applied` hooks the targeted Linear modules for one forward or one generation,
adding `scale * B(A(x))` to the rows of the prompts that run under each adapter. The hooks are
removed on the way out, so the model's weights and modules are never changed."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

import torch
from ie_core.lora import LoraAdapter, LoraError, LoraSpec, load_adapter
from torch import nn
from torch.nn import functional as F

__all__ = ["Adapters", "applied", "applied_per_step"]


class Adapters:
    """The adapters one model has read, by name: a name is read and checked at its first use
    and kept; the same name with another folder is refused."""

    def __init__(self, hf_model: nn.Module, model_name: str) -> None:
        self._model = hf_model
        self._name = model_name
        self._held: dict[str, LoraAdapter] = {}

    def get(self, spec: LoraSpec) -> LoraAdapter:
        held = self._held.get(spec.name)
        if held is not None:
            if held.spec.path != spec.path:
                raise LoraError(
                    f"LoRA adapter name {spec.name!r} is already {held.spec.path!r} on this "
                    f"model, not {spec.path!r}; give the other folder another name"
                )
            return held
        adapter = load_adapter(spec)
        alias = str(getattr(getattr(self._model, "config", None), "_name_or_path", "") or "")
        adapter.check(self._name, self._linear_shape, (alias,))
        self._held[spec.name] = _placed(adapter, next(self._model.parameters()))
        return self._held[spec.name]

    def rows(self, specs: Sequence[LoraSpec | None]) -> list[LoraAdapter | None]:
        """Each prompt's adapter, every one read and checked before any forward."""
        return [None if s is None else self.get(s) for s in specs]

    def _linear_shape(self, path: str) -> tuple[int, int] | None:
        module = dict(self._model.named_modules()).get(path)
        if not isinstance(module, nn.Linear):
            return None
        return module.in_features, module.out_features


@dataclass(frozen=True)
class _Delta:
    """One adapter's A and B at one module, and the batch rows it writes (None: every row)."""

    a: torch.Tensor
    b: torch.Tensor
    scale: float
    rows: torch.Tensor | None

    def add(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        if self.rows is None:
            return out + F.linear(F.linear(x, self.a), self.b) * self.scale
        update = F.linear(F.linear(x[self.rows], self.a), self.b) * self.scale
        return out.index_add(0, self.rows, update)


@contextmanager
def applied(hf_model: nn.Module, per_row: Sequence[LoraAdapter | None]) -> Iterator[None]:
    """Hook every module some prompt's adapter targets while the block runs; `per_row[b]` is
    prompt b's adapter (the batch's rows in order; a generation is one row)."""
    deltas = _deltas(per_row)
    modules = dict(hf_model.named_modules())
    handles = []
    try:
        for path, ds in deltas.items():
            handles.append(modules[path].register_forward_hook(_hook(ds)))
        yield
    finally:
        for handle in handles:
            handle.remove()


T = TypeVar("T")


def applied_per_step(
    hf_model: nn.Module, per_row: Sequence[LoraAdapter | None], steps: Iterator[T]
) -> Iterator[T]:
    """`steps` (a generator whose every `next` runs one forward) with the adapter hooked only
    while each step computes: a stream suspended between its tokens leaves no hook on the shared
    model for another request's forward to meet."""
    while True:
        with applied(hf_model, per_row):
            step = next(steps, None)
        if step is None:
            return
        yield step


def _deltas(per_row: Sequence[LoraAdapter | None]) -> dict[str, list[_Delta]]:
    by_adapter: dict[str, tuple[LoraAdapter, list[int]]] = {}
    for row, adapter in enumerate(per_row):
        if adapter is not None:
            by_adapter.setdefault(adapter.spec.name, (adapter, []))[1].append(row)
    deltas: dict[str, list[_Delta]] = {}
    for adapter, rows in by_adapter.values():
        device = next(iter(adapter.weights.values()))[0].device
        every = len(rows) == len(per_row)
        index = None if every else torch.tensor(rows, dtype=torch.long, device=device)
        for path, (a, b) in adapter.weights.items():
            deltas.setdefault(path, []).append(_Delta(a, b, adapter.scale, index))
    return deltas


def _hook(deltas: list[_Delta]) -> Callable[..., torch.Tensor]:
    def hook(module: nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor) -> torch.Tensor:
        x = args[0]
        for delta in deltas:
            out = delta.add(x, out)
        return out

    return hook


def _placed(adapter: LoraAdapter, like: torch.Tensor) -> LoraAdapter:
    """The adapter's weights on the model's device and dtype, once."""
    weights = {
        path: (a.to(like.device, like.dtype), b.to(like.device, like.dtype))
        for path, (a, b) in adapter.weights.items()
    }
    return LoraAdapter(adapter.spec, adapter.base_model, adapter.rank, adapter.alpha, weights)
