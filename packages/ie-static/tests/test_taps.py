"""The tapped module class (no engine): it keeps the family's class name and forward."""

from __future__ import annotations

import torch
from ie_static.taps import ModuleTaps, _swap_class
from torch import nn


class GPTNeoXAttention(nn.Module):  # named like a family's module, as the resolver sees it
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def test_swapped_class_keeps_the_name_the_resolver_reports() -> None:
    """Refusals name `type(module).__name__`; on vllm-static it must be the family's class, not a
    tap subclass's (a committed vllm-static answer once said `IeStaticGPTNeoXAttention`)."""
    module = GPTNeoXAttention()
    module._ie_static_taps = ModuleTaps()  # type: ignore[assignment]
    _swap_class(module)
    swapped = type(module)
    assert swapped is not GPTNeoXAttention and issubclass(swapped, GPTNeoXAttention)
    assert swapped.__name__ == "GPTNeoXAttention"
    assert swapped.__qualname__ == GPTNeoXAttention.__qualname__
    x = torch.ones(3)
    assert torch.equal(module(x), x * 2)  # no taps: the base forward, unchanged
    _swap_class(module)  # a second swap keeps the one subclass
    assert type(module) is swapped
