"""`ProbeScores`: a linear probe's per-row scores, `activation(h @ weight + bias)` (the maths is
`ie_core.experiments.probes.Probe.scores`, which keeps its weight on the rows' device)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ie_core.errors import SteeringSpecError
from ie_core.experiments.probes import Probe
from ie_core.reduce.base import Context, Reducer

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class ProbeScores(Reducer):
    kind: ClassVar[str] = "probe"
    probe: Probe

    def apply(self, rows: Tensor, context: Context) -> dict[str, Tensor]:
        return {"scores": self.probe.scores(rows)}

    def check(self, width: int, point: str, vocab: int) -> None:
        """The probe's shape, values and activation, checked as `Probe.build` checks them."""
        given = self.probe.arguments()
        Probe.build(given["weight"], given["bias"], given["activation"], width=width, point=point)

    def row_bytes(self, width: int) -> int:
        return 4 * len(self.probe.bias)

    def to_wire(self) -> dict[str, Any]:
        return {"kind": self.kind, **self.probe.to_params()}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> ProbeScores:
        try:
            return cls(Probe.from_params(data))
        except (TypeError, ValueError) as exc:
            raise SteeringSpecError(
                "a probe's weight and bias must be numbers (a [width] vector or [width, n] "
                f"matrix, one bias per output): {exc}"
            ) from None


__all__ = ["ProbeScores"]
