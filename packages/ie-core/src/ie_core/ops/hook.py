"""`Hook`: your own function at a point, run in this process only."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from ie_core.errors import SteeringSpecError, UnsupportedOperationError
from ie_core.ops.base import Op

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class Hook(Op):
    """Your own function at a point: `fn(tensor, address) -> tensor | None` (None keeps it).

    It sees the point's rows in fp32 (`[batch, seq, width]` on eager) and runs in this process
    only: eager runs it in its forward; the vLLM backends and HTTP refuse it (their forwards run in
    other processes), so express the intervention as ops there."""

    fn: Callable[[Any, str | None], Any]
    address: str | None = None
    kind: Literal["hook"] = field(default="hook", init=False)
    travels: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise SteeringSpecError(f"a Hook needs a callable fn(tensor, address), got {self.fn!r}")

    @property
    def width(self) -> None:
        return None  # the function decides

    def apply(self, x: Tensor, positions: Tensor | None) -> Tensor:
        out = self.fn(x, self.address)
        if out is None:
            return x
        if not isinstance(out, type(x)) or out.shape != x.shape:
            shape = getattr(out, "shape", type(out).__name__)
            raise SteeringSpecError(
                f"the hook at {self.address} returned {shape}; return None or a tensor shaped "
                f"like its input {tuple(x.shape)}"
            )
        return out.float()

    def to_wire(self) -> dict[str, Any]:
        raise UnsupportedOperationError(
            "a Hook runs your Python function, which is never sent to a server (it would be "
            "arbitrary code there); express it as ops (Patch, Scale, Additive, ...) or load the "
            "model in-process with backend='eager'"
        )


__all__ = ["Hook"]
