"""Queries and keys after the rotary embedding, exactly as the family computes them.

The rotary families' attentions call their modeling module's `apply_rotary_pos_emb(q, k, cos,
sin)` once per forward, with whole heads in and out (partial rotary happens inside it), before the
KV cache is updated. We swap that module-level name for a pass-through wrapper that, only while an
attention module under capture is running (a context variable set by its pre-hook), hands the
returned `(q, k)` to the session, which reads them or returns written ones: the written keys are
what the cache keeps, and nothing is recomputed.
"""

from __future__ import annotations

import contextvars
import functools
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

Editor = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]

CURRENT: contextvars.ContextVar[Editor | None] = contextvars.ContextVar(
    "ie_rotary_editor", default=None
)
NAME = "apply_rotary_pos_emb"
_MARK = "_ie_eager_rotary_proxy"


def _module_of(attn: nn.Module) -> Any:
    return sys.modules.get(type(attn).__module__)


def has_call(attn: nn.Module) -> bool:
    """True when `attn`'s modeling module defines the rotary function we can observe."""
    return callable(getattr(_module_of(attn), NAME, None))


def _wrap(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def proxy(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        editor = CURRENT.get()
        if editor is None:
            return out
        q, k = out
        return editor(q, k)

    setattr(proxy, _MARK, True)
    return proxy


def install(attn: nn.Module) -> bool:
    """Route `attn`'s modeling module's rotary call through the wrapper (once per module)."""
    module = _module_of(attn)
    current = getattr(module, NAME, None)
    if not callable(current):
        return False
    if not getattr(current, _MARK, False):
        setattr(module, NAME, _wrap(current))
    return True
