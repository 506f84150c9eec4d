"""The tapped module class (no engine): it keeps the family's class name and forward."""

from __future__ import annotations

import types

import pytest
import torch
from ie_static.taps import ModuleTaps, Site, StepInputs, _swap_class, install
from ie_vllm import SiteDef
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


class FusedMLP(nn.Module):
    """Like an HF MLP after vLLM's Transformers backend fused its projections: a rewritten
    forward bound on the instance, shadowing the class's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2  # the unfused forward vLLM no longer runs


def _fused_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return x * 3


def _read_site(module: nn.Module, rows: int, width: int) -> Site:
    where = SiteDef(
        name="mlp.0",
        module=module,
        hook="post",
        read=lambda args, kwargs, out: out,
        write=None,
        width=width,
    )
    step = StepInputs(torch.zeros(rows), torch.zeros(rows), torch.zeros(1, 1, 1, dtype=torch.bool))
    return Site("mlp.0", where, step, buf=torch.zeros(rows, width))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_forward_bound_on_the_instance_is_the_one_tapped(compiled: bool) -> None:
    """vllm-static once read the class's forward's operand on such modules (OLMo-2's attn_out
    off by 0.37) and its writes never reached the model; eager and compiled runs must both see
    the instance's forward, and its output must reach the read buffer."""
    x = torch.arange(6.0).reshape(2, 3)
    module = FusedMLP()
    module.forward = types.MethodType(_fused_forward, module)  # type: ignore[method-assign]
    site = _read_site(module, rows=2, width=3)
    install([site], site.step)
    run = torch.compile(module, backend="eager", fullgraph=True) if compiled else module
    out = run(x)
    assert torch.equal(out, x * 3)
    assert site.buf is not None and torch.equal(site.buf, x * 3)
    assert "forward" not in module.__dict__  # the tapped class forward is what runs now
