"""The wire specs of one request: what to capture, how to steer, what to reduce in the worker.

The host builds them (`ie_vllm.host.admission`); the request carries its spec to every worker as
JSON in vLLM's per-request `extra_args` (`to_json`, each op as `Op.to_wire` writes it for HTTP),
and the worker rebuilds it (`from_json`) into its registry when the request first reaches a
forward (`ie_vllm.worker.extension`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ie_core.ops import SteeringOp, op_from_dict
from ie_core.reduce import Reducer, reducer_from_dict

__all__ = ["ReducerSpec", "RequestSpec", "SteerSpec"]


@dataclass(frozen=True)
class ReducerSpec:
    """`reducer` (an `ie_core.reduce` kind) applied to the rows of `address` (only the row at
    `position` when given); outputs are collected as `label|<output>`."""

    label: str
    address: str
    reducer: Reducer
    position: int | None = None

    def to_wire(self) -> dict[str, Any]:
        return {"label": self.label, "address": self.address, "position": self.position,
                "reducer": self.reducer.to_wire()}  # fmt: skip

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> ReducerSpec:
        at = data.get("position")
        return cls(str(data["label"]), str(data["address"]), reducer_from_dict(data["reducer"]),
                   None if at is None else int(at))  # fmt: skip


@dataclass(frozen=True)
class SteerSpec:
    """Ops at one address; prompt positions in `masked` are left alone, and with `until` (a
    prefill-only scope) every position from `until` on."""

    address: str
    ops: tuple[SteeringOp, ...]
    masked: tuple[int, ...] = ()
    until: int | None = None


@dataclass(frozen=True)
class RequestSpec:
    key: str
    captures: tuple[str, ...] = ()
    steering: tuple[SteerSpec, ...] = ()
    prompt_len: int = 0
    reducers: tuple[ReducerSpec, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "captures": list(self.captures),
            "prompt_len": self.prompt_len,
            "steering": [
                {
                    "address": s.address,
                    "masked": list(s.masked),
                    "until": s.until,
                    "ops": [op.to_wire() for op in s.ops],
                }
                for s in self.steering
            ],
            "reducers": [r.to_wire() for r in self.reducers],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_wire(), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> RequestSpec:
        return cls.from_wire(json.loads(text))

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> RequestSpec:
        steering = tuple(
            SteerSpec(
                s["address"],
                tuple(op_from_dict(op) for op in s["ops"]),
                tuple(s["masked"]),
                s.get("until"),
            )
            for s in data.get("steering", ())
        )
        reducers = tuple(ReducerSpec.from_wire(r) for r in data.get("reducers", ()))
        captures = tuple(data.get("captures", ()))
        return cls(data["key"], captures, steering, int(data["prompt_len"]), reducers)
