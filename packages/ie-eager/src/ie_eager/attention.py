"""Attention scores and probabilities exactly as the family computes them.

Every HF eager attention (the shared `eager_attention_forward`, GPT-J's `_attn`, BLOOM's and
Falcon's inline code) ends in one `nn.functional.softmax` / `F.softmax` call from its modeling
module: its input is the scaled, softcapped, masked (dtype min) score tensor with ALiBi included,
its output the probabilities. We swap that module's `nn` / `F` names for thin proxies that pass
every call through unchanged and, only while an attention module under capture is running, hand
the softmax input and output to its recorder. Nothing is recomputed, so nothing can drift.
"""

from __future__ import annotations

import contextvars
import sys
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

Recorder = Callable[[torch.Tensor, torch.Tensor], None]

CURRENT: contextvars.ContextVar[Recorder | None] = contextvars.ContextVar(
    "ie_attn_recorder", default=None
)
_MARK = "_ie_eager_softmax_proxy"


def _softmax(*args: Any, **kwargs: Any) -> torch.Tensor:
    out = torch.nn.functional.softmax(*args, **kwargs)
    recorder = CURRENT.get()
    if recorder is not None:
        scores = args[0] if args else kwargs["input"]
        recorder(scores, out)
    return out


class _FunctionalProxy(types.ModuleType):
    """`torch.nn.functional` with a recording `softmax`."""

    def __init__(self) -> None:
        super().__init__("ie_eager_functional_proxy")
        self.softmax = _softmax
        setattr(self, _MARK, True)

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.nn.functional, name)


class _NNProxy(types.ModuleType):
    """`torch.nn` whose `functional` is the recording proxy."""

    def __init__(self, functional: _FunctionalProxy) -> None:
        super().__init__("ie_eager_nn_proxy")
        self.functional = functional
        setattr(self, _MARK, True)

    def __getattr__(self, name: str) -> Any:
        return getattr(nn, name)


_FUNCTIONAL = _FunctionalProxy()
_NN = _NNProxy(_FUNCTIONAL)


def install(attn_module: nn.Module) -> bool:
    """Route the softmax of `attn_module`'s modeling module through the recorder proxies.

    Returns False when the module calls softmax some other way (then scores cannot be recorded)."""
    module = sys.modules.get(type(attn_module).__module__)
    if module is None:
        return False
    installed = False
    for name, proxy in (("nn", _NN), ("F", _FUNCTIONAL), ("functional", _FUNCTIONAL)):
        current = getattr(module, name, None)
        if current is None:
            continue
        if getattr(current, _MARK, False):
            installed = True
            continue
        if current is nn or current is torch.nn.functional:
            setattr(module, name, proxy)
            installed = True
    return installed


def strip_sinks(
    module: nn.Module, scores: torch.Tensor, probs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop the learned sink column of sink families (gpt-oss, DeepSeek-V4).

    They softmax `[scores | sink] - m` (m the row max over both) and keep the first k columns
    of the probabilities, so rows need not sum to 1. The recorded last column is `sink - m`, and
    `sink` is the module's own parameter, so `m` and the unshifted scores (q.k scaled plus mask)
    are recovered exactly up to one rounding: scores = recorded[..., :k] + (sink - recorded[..., k]).
    """
    sinks = getattr(module, "sinks", None)
    if not isinstance(sinks, torch.Tensor):
        return scores, probs
    sink = sinks.detach().to(scores.dtype).reshape(1, -1, 1)
    shift = sink - scores[..., -1]
    return scores[..., :-1] + shift.unsqueeze(-1), probs[..., :-1]
