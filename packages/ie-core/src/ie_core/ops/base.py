"""What every op is: a frozen spec that owns its maths.

An op knows its width, the largest value it can write (for the dtype-range check), its row update
in fp32, its wire form and, where it is affine, the form vllm-static's tables compile from. The
maths uses tensor methods only, so importing an op never imports torch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ie_core.ops.vectors import without_cache

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class AffineForm:
    """delta = (alpha * p + beta * (clamp(p, lo, hi) - p) + gamma * |h| + const) * w, p = h . u.

    Every additive op but a thresholded `FeatureClamp` has this form; vllm-static's write tap
    evaluates it for every op slot at once."""

    u: Tensor
    w: Tensor
    alpha: float = 0.0
    beta: float = 0.0
    gamma: float = 0.0
    const: float = 0.0
    lo: float = -math.inf
    hi: float = math.inf


@dataclass(frozen=True)
class Replacement:
    """h <- h * mul + row, for an op that replaces values instead of adding a delta.

    `mul` is [width]; a patch also writes `values` ([rows, width], zero outside its columns) at
    `positions` (None: one row at every position). vllm-static's write tap evaluates this form."""

    mul: Tensor
    values: Tensor | None = None
    positions: tuple[int, ...] | None = None


class Op:
    """The interface of a steering or intervention op (`kind` is each op's dataclass field)."""

    kind: str
    travels: ClassVar[bool] = True  # False: holds Python code, never leaves its process

    def __getstate__(self) -> dict[str, Any]:
        """The op's fields, without the device tensors it keeps (`ops.vectors.cached`)."""
        return without_cache(self)

    @property
    def width(self) -> int | None:
        """The width the op's own values fix; None where it fits any width."""
        raise NotImplementedError

    def peak(self) -> tuple[float, str] | None:
        """The largest magnitude the op writes by itself, and how to name it in a refusal; None
        where what it writes is bounded by the activations (a direction, a factor)."""
        return None

    def check_width(self, width: int, where: str) -> None:
        """Refuse what only the point's width on a model can show (heads that do not split it)."""

    def check_site(self, address: str) -> None:
        """Refuse a site the op cannot run at (a condition read at a later point)."""

    def first_position(self) -> int:
        """The first sequence position the op can change (0: any); a backend may reuse an
        unsteered run's rows before it, which a causal model leaves as they were."""
        return 0

    def condition_read(self, address: str) -> str | None:
        """The earlier point whose rows decide where this op writes at `address`; None where
        the op reads only the rows it writes (a backend judges that point's rows first)."""
        return None

    def check_read(self, width_of: Callable[[str], int]) -> None:
        """Refuse a condition whose probe is not as wide as the point it reads (`width_of`: the
        backend's width of a readable point, raising where it cannot read it)."""

    def judge(self, rows: Tensor) -> Tensor:
        """What the op needs from the rows of the earlier point it reads (`condition_read`), one
        value per row (`rows.shape[:-1]`); a backend computes it there, in the same forward."""
        raise TypeError(f"a {self.kind} op reads no earlier point, so it has nothing to judge")

    def judged(self, held: Tensor) -> Op:
        """The op for one forward, given what `judge` found at its earlier point."""
        raise TypeError(f"a {self.kind} op reads no earlier point, so it has nothing to judge")

    def static_refusal(self) -> str | None:
        """Why vllm-static's compiled affine tables cannot run this op, with what to use
        instead; None where they can."""
        return None

    def delta(self, h: Tensor) -> Tensor:
        """The fp32 delta for rows `h` ([..., width], fp32) of an op that adds one."""
        raise TypeError(f"{self.kind} replaces rows; it has no delta (use apply)")

    def apply(self, x: Tensor, positions: Tensor | None) -> Tensor:
        """The op on fp32 rows `x`; `positions` are the rows' absolute sequence positions."""
        return x + self.delta(x)

    def affine(self, like: Tensor) -> AffineForm | None:
        """The op as vllm-static's affine delta (vectors built like `like`), or None."""
        return None

    def replacement(self, width: int, like: Tensor) -> Replacement | None:
        """The op as a replacement `h * mul + row` of `width` columns, or None for an op that
        adds a delta (see `affine`)."""
        return None

    def patch_rows(self) -> int:
        """How many rows the op writes by value (a patch's positions); 0 for every other op."""
        return 0

    def to_wire(self) -> dict[str, Any]:
        """Plain JSON data; `ie_core.ops.kinds.op_from_dict` reads it back."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}  # type: ignore[arg-type]
        return {
            "kind": self.kind,
            **{k: list(v) if isinstance(v, tuple) else v for k, v in data.items()},
        }


__all__ = ["AffineForm", "Op", "Replacement"]
