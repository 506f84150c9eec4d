"""What an address resolves to on eager: a tensor position on a real module (`Tap`) and how the
point is produced from it (`Resolved`). The resolver builds these; the hooks act on them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch
from ie_core.grammar import Address
from torch import nn

from ie_eager.selectors import Selector, Whole
from ie_eager.structure import Block

Io = Literal["in", "out"]
Kind = Literal["tap", "sum", "branch", "attention", "rotary"]


@dataclass(frozen=True)
class Tap:
    """A tensor position on a real module: its input hidden states or output element `item`."""

    path: str
    module: nn.Module = None  # type: ignore[assignment]
    io: Io = "out"
    item: int = 0
    select: Selector = Whole()  # noqa: RUF009 - frozen, so one shared default is safe

    def __post_init__(self) -> None:
        # The site key pairs the module with io: any other value would install a second,
        # unordered hook on the same module.
        if self.io not in get_args(Io):
            raise ValueError(f"a tap's io is 'in' or 'out', not {self.io!r} ({self.path})")

    @property
    def site(self) -> tuple[int, str]:
        return id(self.module), self.io


@dataclass(frozen=True)
class Resolved:
    """How one address is produced. kind: `tap` reads `tap` (times `scale`); `sum` is `base` plus
    `tap` (times `scale`), added in the model's own order; `branch` is (`base` + `tap`) times
    `scale`, two modules the block sums inline (Granite-4.0-H's routed and shared MLPs; `base`
    runs first, and a write changes only `tap`); `attention` records the softmax; `rotary` acts on item 0 (queries) or 1 (keys) of the
    attention's rotary call, whose module is `tap.module`."""

    address: Address
    kind: Kind
    tap: Tap
    width: int | None
    writable: bool
    scale: float | None = None
    base: Tap | None = None

    def __post_init__(self) -> None:
        if self.kind not in get_args(Kind):
            raise ValueError(f"{self.address}: unknown kind {self.kind!r}")

    def compose(self, part: torch.Tensor, base: torch.Tensor | None) -> torch.Tensor:
        """The point's value from its tap's tensor `part` (and the remembered `base` of a `sum`
        or `branch`)."""
        if self.kind == "branch":
            assert base is not None
            part = base + part
        if self.scale is not None:
            part = part * self.scale
        if self.kind == "sum":
            assert base is not None
            part = base + part
        return part

    def decompose(self, value: torch.Tensor, base: torch.Tensor | None) -> torch.Tensor:
        """The tap's tensor that makes the point `value`: `compose` undone. A `branch` keeps
        its base's share (the routed MLP's); only the tap's (the shared MLP's output) moves."""
        if self.kind == "sum":
            assert base is not None
            value = value - base
        if self.scale is not None:
            value = value / self.scale
        if self.kind == "branch":
            assert base is not None
            value = value - base
        return value


def tap_on(block: Block, owner: tuple[str, nn.Module] | None, io: str = "out", **kw) -> Tap | None:
    """A tap on `owner` (a block child found by name), or None when the block has no such child."""
    if owner is None:
        return None
    path = f"{block.path}.{owner[0]}" if owner[0] else block.path
    return Tap(path, owner[1], io, **kw)  # type: ignore[arg-type]


def block_tap(block: Block, io: str) -> Tap:
    return Tap(block.path, block.module, io)  # type: ignore[arg-type]
