"""What a vllm-static engine declared at load: read sites, write sites, table sizes.

It travels to the workers in vLLM's `additional_config` (which vLLM hashes into its compile cache
key, so a tapped graph is never confused with an untapped one).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

CONFIG_KEY = "ie_static"


@dataclass(frozen=True)
class StaticConfig:
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    slots: int = 16  # steered requests in flight at once
    ops: int = 4  # ops per write site per request
    masks: int = 4  # distinct position masks per request
    patch_rows: int = 16  # rows one Patch may write per site per request

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["reads"] = list(self.reads)
        data["writes"] = list(self.writes)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StaticConfig:
        return cls(
            reads=tuple(data["reads"]),
            writes=tuple(data["writes"]),
            slots=int(data["slots"]),
            ops=int(data["ops"]),
            masks=int(data["masks"]),
            patch_rows=int(data.get("patch_rows", 16)),
        )
