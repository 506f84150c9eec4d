"""Readers and writers of hook arguments and outputs: one point's `[tokens, width]` rows.

A reader takes `(args, kwargs, output)` of a hook and returns the rows; a writer takes the same
plus the steered rows and returns what the hook hands back to torch. `batched` readers see the
Transformers modeling backend's `[1, tokens, width]` tensors; vLLM's own layers pass
`[tokens, ...]`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = [
    "Args",
    "BranchSum",
    "Kwargs",
    "Reader",
    "Writer",
    "column_slice",
    "head_slice",
    "post_first",
    "post_out",
    "post_sum",
    "pre_arg",
    "pre_sum",
    "qkv_arg",
    "scaled_out",
]

Args = tuple[Any, ...]
Kwargs = dict[str, Any]
Reader = Callable[[Args, Kwargs, Any], torch.Tensor]
Writer = Callable[[Args, Kwargs, Any, torch.Tensor], Any]


def _first(x: Any) -> torch.Tensor:
    return x[0] if isinstance(x, tuple | list) else x


def _arg(args: Args, kwargs: Kwargs, name: str, index: int) -> torch.Tensor:
    return kwargs[name] if name in kwargs else args[index]


def _set_arg(args: Args, kwargs: Kwargs, name: str, index: int, value: Any) -> tuple[Args, Kwargs]:
    if name in kwargs:
        return args, {**kwargs, name: value}
    return (*args[:index], value, *args[index + 1 :]), kwargs


def _flat(t: torch.Tensor, batched: bool = False) -> torch.Tensor:
    """Rows of a hook tensor: `[tokens, ...]` -> `[tokens, width]`; batched drops the batch of 1."""
    return t.reshape(-1, t.shape[-1]) if batched else t.reshape(t.shape[0], -1)


def pre_arg(name: str, index: int, batched: bool = False) -> tuple[Reader, Writer]:
    """A module input; multi-dim inputs ([tokens, heads, dim]) are read flat."""

    def read(args: Args, kwargs: Kwargs, _: Any) -> torch.Tensor:
        return _flat(_arg(args, kwargs, name, index), batched)

    def write(args: Args, kwargs: Kwargs, _: Any, new: torch.Tensor) -> Any:
        old = _arg(args, kwargs, name, index)
        return _set_arg(args, kwargs, name, index, new.reshape(old.shape))

    return read, write


def post_out(batched: bool = False) -> tuple[Reader, Writer]:
    """A module output (a tensor, or the first item of a `(out, bias)` tuple)."""

    def read(_a: Args, _k: Kwargs, out: Any) -> torch.Tensor:
        return _flat(_first(out), batched)

    def write(_a: Args, _k: Kwargs, out: Any, new: torch.Tensor) -> Any:
        old = _first(out)
        new = new.reshape(old.shape)
        return (new, *out[1:]) if isinstance(out, tuple) else new

    return read, write


def scaled_out(scale: torch.Tensor | float, batched: bool = False) -> tuple[Reader, Writer]:
    """An output the model multiplies by `scale` outside the module (Gemma's embedding, Granite's
    embedding and residual multipliers)."""

    def read(_a: Args, _k: Kwargs, out: Any) -> torch.Tensor:
        return _flat(_first(out), batched) * scale

    def write(_a: Args, _k: Kwargs, out: Any, new: torch.Tensor) -> Any:
        old = _first(out)
        new = (new / scale).reshape(old.shape)
        return (new, *out[1:]) if isinstance(out, tuple) else new

    return read, write


def pre_sum(h_name: str, h_index: int, r_name: str, r_index: int) -> tuple[Reader, Writer]:
    """A residual passed as (hidden, residual) inputs: the stream is their sum (residual may be None)."""

    def read(args: Args, kwargs: Kwargs, _: Any) -> torch.Tensor:
        h = _arg(args, kwargs, h_name, h_index)
        r = _arg(args, kwargs, r_name, r_index) if len(args) > r_index or r_name in kwargs else None
        return h if r is None else h + r

    def write(args: Args, kwargs: Kwargs, _: Any, new: torch.Tensor) -> Any:
        has_r = len(args) > r_index or r_name in kwargs
        r = _arg(args, kwargs, r_name, r_index) if has_r else None
        args, kwargs = _set_arg(args, kwargs, h_name, h_index, new)
        if r is not None:
            args, kwargs = _set_arg(args, kwargs, r_name, r_index, torch.zeros_like(r))
        return args, kwargs

    return read, write


def post_sum() -> tuple[Reader, Writer]:
    """A decoder layer's `(hidden, residual)` output: the residual stream is their sum."""

    def read(_a: Args, _k: Kwargs, out: Any) -> torch.Tensor:
        return out[0] + out[1] if isinstance(out, tuple) else out

    def write(_a: Args, _k: Kwargs, out: Any, new: torch.Tensor) -> Any:
        return (new, torch.zeros_like(out[1])) if isinstance(out, tuple) else new

    return read, write


def post_first() -> tuple[Reader, Writer]:
    """A decoder layer returning `(stream, other)` where the next layer ignores `other`
    (vLLM's Cohere and StableLM): the residual stream is the first item alone."""

    def read(_a: Args, _k: Kwargs, out: Any) -> torch.Tensor:
        return _first(out)

    def write(_a: Args, _k: Kwargs, out: Any, new: torch.Tensor) -> Any:
        return (new, *out[1:]) if isinstance(out, tuple) else new

    return read, write


def column_slice(start: int, stop: int, batched: bool = False) -> tuple[Reader, Writer]:
    """Columns [start, stop) of a fused projection's output (the value third of qkv)."""

    def read(_a: Args, _k: Kwargs, out: Any) -> torch.Tensor:
        return _flat(_first(out)[..., start:stop], batched)

    def write(_a: Args, _k: Kwargs, out: Any, new: torch.Tensor) -> Any:
        full = _first(out).clone()
        full[..., start:stop] = new.reshape(full[..., start:stop].shape)
        return (full, *out[1:]) if isinstance(out, tuple) else full

    return read, write


def head_slice(groups: int, per: int, index: int, head_dim: int, batched: bool = False):
    """Slot `index` of `per` head-sized slots in each of `groups` groups of a fused output: the
    value of HF GPT-NeoX's per-head `[q, k, v]` layout is `head_slice(heads, 3, 2, head_dim)`."""

    def view(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(*t.shape[:-1], groups, per, head_dim)[..., index, :]

    def read(_a: Args, _k: Kwargs, out: Any) -> torch.Tensor:
        v = view(_first(out))
        return _flat(v.reshape(*v.shape[:-2], groups * head_dim), batched)

    def write(_a: Args, _k: Kwargs, out: Any, new: torch.Tensor) -> Any:
        full = _first(out).clone()
        slot = view(full)
        slot.copy_(new.reshape(slot.shape))
        return (full, *out[1:]) if isinstance(out, tuple) else full

    return read, write


class BranchSum:
    """Two sibling modules whose outputs the layer adds inline (Granite-4.0-H's routed and shared
    MLPs): a hook on the first remembers its output, the site on the second reads the sum.

    `companion` is that first hook; it is installed with the site and replaces the remembered
    output on every forward. A write `new` to the sum (times `scale`) becomes
    `new / scale - routed` at the second module, so the layer's own addition yields `new / scale`.
    """

    def __init__(self) -> None:
        self.first: torch.Tensor | None = None

    def companion(self, _module: Any, _args: Args, output: Any) -> None:
        self.first = _first(output)

    def _routed(self, like: torch.Tensor) -> torch.Tensor:
        first = self.first
        if first is None or first.shape != like.shape:
            raise RuntimeError(
                "the routed MLP's output of this forward was not seen before the shared one"
            )
        return first

    def rw(self, scale: float = 1.0) -> tuple[Reader, Writer]:
        def read(_a: Args, _k: Kwargs, out: Any) -> torch.Tensor:
            shared = _first(out)
            return _flat(self._routed(shared) + shared) * scale

        def write(_a: Args, _k: Kwargs, out: Any, new: torch.Tensor) -> Any:
            shared = _first(out)
            return (new / scale).reshape(shared.shape) - self._routed(shared)

        return read, write


def qkv_arg(index: int) -> tuple[Reader, Writer | None]:
    """Post-RoPE q (0) or k (1) as passed to vLLM's attention layer; read only."""

    def read(args: Args, kwargs: Kwargs, _: Any) -> torch.Tensor:
        names = ("query", "key")
        return _flat(kwargs[names[index]] if names[index] in kwargs else args[index])

    return read, None
