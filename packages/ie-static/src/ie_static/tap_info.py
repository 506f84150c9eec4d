"""`TapInfo`: what a vllm-static worker tapped, sent back once at start-up.

The worker reports the sites it installed (a declared set less what the model lacks), the
reasons for the rest and the memory its buffers and tables took; the host checks it with
`from_wire` and sizes its policy from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ie_core.model_info import ModelInfoError

__all__ = ["TapInfo"]


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
