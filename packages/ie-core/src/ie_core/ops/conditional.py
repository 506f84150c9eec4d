"""`Conditional`: another op applied only on the rows where a linear condition holds.

The condition is a linear probe's score, `activation(h . probe + bias) > threshold`, computed on
the rows the op writes at the same step; a dictionary feature's activation is the probe of its
encoder column (`ie_core.experiments.features.when_feature` builds one). Not affine (the row
decides whether anything is written), so vllm-static's compiled tables cannot run it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ie_core.errors import ConditionPointError, SteeringSpecError
from ie_core.grammar import to_address
from ie_core.ops.base import Op
from ie_core.ops.values import as_vector, real_number

if TYPE_CHECKING:
    from torch import Tensor

ACTIVATIONS = ("linear", "relu", "sigmoid", "tanh")


def activate(scores: Tensor, activation: str) -> Tensor:
    """One of `ACTIVATIONS` on a probe's raw scores (a condition's and `probe_scores`' alike)."""
    if activation == "relu":
        return scores.relu()
    if activation == "sigmoid":
        return scores.sigmoid()
    if activation == "tanh":
        return scores.tanh()
    return scores


@dataclass(frozen=True)
class Conditional(Op):
    """`op` on the rows where activation(h . probe + bias) > threshold; other rows unchanged.

    The condition reads the rows as this op receives them (after the ops before it at the same
    site), so each token, prompt or generated, is steered by its own row's score. `read` names
    the point the condition was made for (None: wherever the op is placed); a condition read at
    another point than the one written is refused (`ConditionPointError`)."""

    op: Any
    probe: Any
    bias: float = 0.0
    threshold: float = 0.0
    activation: str = "linear"
    read: str | None = None
    kind: Literal["conditional"] = field(default="conditional", init=False)

    def __post_init__(self) -> None:
        inner = self.op
        if isinstance(inner, Mapping):  # the wire form nests the op's own wire form
            from ie_core.ops.kinds import op_from_dict  # kinds imports this module

            inner = op_from_dict(inner)
        if not isinstance(inner, Op):
            raise SteeringSpecError(
                f"a Conditional needs an op to apply (Additive, FeatureClamp, ...), got "
                f"{type(inner).__name__}"
            )
        if not inner.travels:
            raise SteeringSpecError(
                f"a Conditional cannot wrap a {inner.kind}: its function already sees the rows, "
                "so test the condition inside it"
            )
        probe = as_vector(self.probe, "probe")
        if inner.width is not None and inner.width != len(probe):
            raise SteeringSpecError(
                f"the probe is {len(probe)} wide but the {inner.kind} op writes {inner.width}-wide "
                "rows; the condition reads the rows the op writes, so give a probe of their width"
            )
        if self.activation not in ACTIVATIONS:
            raise SteeringSpecError(
                f"activation must be one of {', '.join(ACTIVATIONS)}, got {self.activation!r}"
            )
        if self.read is not None:
            if not isinstance(self.read, str):
                raise SteeringSpecError(f"read must be an address string, got {self.read!r}")
            object.__setattr__(self, "read", str(to_address(self.read, check=True)))
        object.__setattr__(self, "op", inner)
        object.__setattr__(self, "probe", probe)
        object.__setattr__(self, "bias", real_number(self.bias, "bias"))
        object.__setattr__(self, "threshold", real_number(self.threshold, "threshold"))

    @property
    def width(self) -> int:
        return len(self.probe)

    def peak(self) -> tuple[float, str] | None:
        return self.op.peak()

    def check_width(self, width: int, where: str) -> None:
        self.op.check_width(width, where)

    def check_site(self, address: str) -> None:
        if self.read is not None and self.read != address:
            raise ConditionPointError(
                f"this condition reads {self.read} but the op writes {address}; a condition is "
                f"computed from the rows it steers, at the same step: place the op at {self.read}, "
                "or fit the probe on the rows of the point you steer"
            )
        self.op.check_site(address)

    def score(self, h: Tensor) -> Tensor:
        """activation(h . probe + bias) per row, in float64 so that a row near the threshold is
        judged the same on every backend that hands over the same fp32 rows."""
        h64 = h.double()
        return activate(h64 @ h64.new_tensor(self.probe) + self.bias, self.activation)

    def holds(self, h: Tensor) -> Tensor:
        """Where the condition holds: bool, `h.shape[:-1]`."""
        return self.score(h) > self.threshold

    def delta(self, h: Tensor) -> Tensor:
        return self.op.delta(h).where(self.holds(h).unsqueeze(-1), h.new_zeros(()))

    def apply(self, x: Tensor, positions: Tensor | None) -> Tensor:
        return self.op.apply(x, positions).where(self.holds(x).unsqueeze(-1), x)

    def static_refusal(self) -> str:
        return (
            "a Conditional op is not available on backend 'vllm-static': whether it writes "
            "depends on each row's score, and the compiled tables hold affine ops only (a fixed "
            "form of h); use backend='vllm' (the hooked engine) or 'eager'"
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "op": self.op.to_wire(),
            "probe": list(self.probe),
            "bias": self.bias,
            "threshold": self.threshold,
            "activation": self.activation,
            "read": self.read,
        }


__all__ = ["ACTIVATIONS", "Conditional", "activate"]
