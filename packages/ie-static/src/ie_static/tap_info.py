"""`TapInfo`: what a vllm-static worker tapped, sent back once at start-up.

The worker reports the sites it installed (a declared set less what the model lacks), the
reasons for the rest and the memory its buffers and tables took; the host checks it with
`from_wire` and sizes its policy from it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ie_core.model_info import ModelInfoError

__all__ = ["TapInfo", "merge_taps"]


@dataclass(frozen=True)
class TapInfo:
    """Installed read and write sites, refusals, and the worker's tap memory."""

    reads: tuple[str, ...]
    writes: tuple[str, ...]
    refused: Mapping[str, str] = field(default_factory=dict)  # address or point -> reason
    read_sites: int = 0
    rows: int = 0
    buffer_bytes: int = 0
    table_bytes: int = 0
    slots: int = 0
    ops: int = 0
    masks: int = 0
    positions: int = 0
    device: str = "cpu"
    planned_bytes: int = 0  # the host's plan for the same buffers, set after start-up

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> TapInfo:
        if "reads" not in data or "writes" not in data:
            raise ModelInfoError("the vllm-static worker's tap report has no reads / writes")
        numbers = {k: int(data.get(k) or 0) for k in _NUMBERS}
        return cls(
            reads=tuple(str(a) for a in data["reads"]),
            writes=tuple(str(a) for a in data["writes"]),
            refused={str(k): str(v) for k, v in dict(data.get("refused") or {}).items()},
            device=str(data.get("device") or "cpu"),
            **numbers,
        )

    def to_wire(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(reads=list(self.reads), writes=list(self.writes), refused=dict(self.refused))
        return out

    def planned(self, total: int) -> TapInfo:
        return replace(self, planned_bytes=total)


def merge_taps(wires: Sequence[Mapping[str, Any]]) -> TapInfo:
    """One report from every rank's (ranks in order, stage by stage): each pipeline stage taps
    the layers it holds, so reads and writes are the union over stages, a refusal stays only for
    what no stage tapped, and the memory is the stages' sum (tensor ranks repeat their stage's)."""
    per_stage: dict[int, TapInfo] = {}
    for wire in wires:
        per_stage.setdefault(int(wire.get("stage") or 0), TapInfo.from_wire(wire))
    stages = [per_stage[rank] for rank in sorted(per_stage)]
    if len(stages) == 1:
        return stages[0]
    reads = tuple(dict.fromkeys(a for t in stages for a in t.reads))
    writes = tuple(dict.fromkeys(a for t in stages for a in t.writes))
    tapped = {*reads, *writes}  # a trunk site refused where it does not run is tapped elsewhere
    refused = {k: why for t in stages for k, why in t.refused.items() if k not in tapped}
    return replace(
        stages[0],
        reads=reads,
        writes=writes,
        refused=refused,
        read_sites=sum(t.read_sites for t in stages),
        buffer_bytes=sum(t.buffer_bytes for t in stages),
        table_bytes=sum(t.table_bytes for t in stages),
    )


_NUMBERS = (
    "read_sites",
    "rows",
    "buffer_bytes",
    "table_bytes",
    "slots",
    "ops",
    "masks",
    "positions",
    "planned_bytes",
)
