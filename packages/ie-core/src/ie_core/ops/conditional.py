"""`Conditional`: another op applied only on the rows where a linear condition holds.

The condition is a linear probe's score, `activation(h . probe + bias) > threshold`, computed at
the same step on the rows the op writes, or on the same tokens' rows at an earlier point of the
forward (`read`); a dictionary feature's activation is the probe of its encoder column
(`ie_core.experiments.features.when_feature` builds one). Not affine (the row decides whether
anything is written), so vllm-static's compiled tables cannot run it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from ie_core.errors import ConditionPointError, SteeringSpecError
from ie_core.grammar import Width, get_point, runs_before, to_address
from ie_core.ops.base import Op
from ie_core.ops.values import as_vector, real_number
from ie_core.ops.vectors import cached, on_device

if TYPE_CHECKING:
    from torch import Tensor

ACTIVATIONS = ("linear", "relu", "sigmoid", "tanh")
_NOT_ROWS = (Width.HQK, Width.VOCAB)  # attention maps and logits: no probe-width row per token


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
    the point the condition reads (None: wherever the op is placed); a point computed earlier in
    the forward than the one written is judged there, on the same tokens' rows as they leave
    that point (after its writes), and the op applied where it held. A later point is refused
    (`ConditionPointError`): the rows it would read do not exist yet."""

    op: Any
    probe: Any
    bias: float = 0.0
    threshold: float = 0.0
    activation: str = "linear"
    read: str | None = None
    kind: Literal["conditional"] = field(default="conditional", init=False)

    def __post_init__(self) -> None:
        inner = self.op
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
        # With `read` given, the probe's width is that point's, checked where a model knows it.
        if self.read is None and inner.width is not None and inner.width != len(probe):
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
    def width(self) -> int | None:
        """The written rows' width: the probe's where it reads them, else the op's."""
        return len(self.probe) if self.read is None else self.op.width

    def peak(self) -> tuple[float, str] | None:
        return self.op.peak()

    def first_position(self) -> int:
        return self.op.first_position()

    def check_width(self, width: int, where: str) -> None:
        self.op.check_width(width, where)

    def check_site(self, address: str) -> None:
        read = self.condition_read(address)
        if read is not None:
            check_earlier_read(read, address)
        if self.op.condition_read(address) is not None:
            raise ConditionPointError(
                "a Conditional inside a Conditional judges the rows the outer one writes; give "
                "only the outermost one a `read` at another point"
            )
        self.op.check_site(address)

    def condition_read(self, address: str) -> str | None:
        return self.read if self.read not in (None, address) else None

    def check_read(self, width_of: Callable[[str], int]) -> None:
        if self.read is not None and (width := width_of(self.read)) != len(self.probe):
            raise SteeringSpecError(
                f"the probe is {len(self.probe)} wide but the condition reads {self.read}, "
                f"{width} wide on this model; give a probe of that point's width"
            )

    def score(self, h: Tensor) -> Tensor:
        """activation(h . probe + bias) per row, in float64 so that a row near the threshold is
        judged the same on every backend that hands over the same fp32 rows."""
        h64 = h.double()
        probe = cached(self, "probe", h64, lambda: on_device(self.probe, h64))
        return activate(h64 @ probe + self.bias, self.activation)

    def holds(self, h: Tensor) -> Tensor:
        """Where the condition holds: bool, `h.shape[:-1]`."""
        return self.score(h) > self.threshold

    def judge(self, rows: Tensor) -> Tensor:
        return self.holds(rows)

    def judged(self, held: Tensor) -> Op:
        return Judged(self.op, held)

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


@dataclass(frozen=True, eq=False)
class Judged(Op):
    """A `Conditional`'s op on the rows where its condition held at an earlier point of this
    forward: built by the backend for one forward, never on a wire."""

    op: Op
    holds: Any  # bool tensor: the written rows' shape without the width (or a prefix of it)
    kind: Literal["judged"] = field(default="judged", init=False)
    travels: ClassVar[bool] = False

    @property
    def width(self) -> int | None:
        return self.op.width

    def apply(self, x: Tensor, positions: Tensor | None) -> Tensor:
        held = self.holds.to(x.device)
        held = held.reshape(*held.shape, *(1,) * (x.dim() - held.dim()))
        return self.op.apply(x, positions).where(held, x)


def check_earlier_read(read: str, address: str) -> None:
    """Refuse an op written at `address` that reads `read`: not one row per token, or not
    computed before `address` in the forward (its rows would not exist yet)."""
    if get_point(to_address(read).name).width in _NOT_ROWS:
        raise ConditionPointError(
            f"{read} is not one row per token, so no probe reads it; read a point whose rows "
            "are one vector per token (resid_post, z, mlp_out, ...)"
        )
    if not runs_before(to_address(read), to_address(address)):
        raise ConditionPointError(
            f"this op reads {read} but writes {address}, which is not computed after {read} in "
            f"the forward; what it reads is judged at its point, earlier in the same step than "
            f"the write: place the op at {read} or later, or read an earlier point's rows"
        )


def judge(op: Op, rows: Tensor) -> Tensor:
    """What `op` needs from `rows`, the rows of the earlier point it reads (`Op.judge`)."""
    return op.judge(rows)


def with_judged(ops: Sequence[Op], held: Mapping[int, Tensor]) -> tuple[Op, ...]:
    """`ops` with each op `j` in `held` (one reading an earlier point) replaced by its form for
    this forward, given what a backend judged at that point (`Op.judged`)."""
    return tuple(op.judged(held[j]) if j in held else op for j, op in enumerate(ops))


__all__ = [
    "ACTIVATIONS",
    "Conditional",
    "Judged",
    "activate",
    "check_earlier_read",
    "judge",
    "with_judged",
]
