"""The wire specs of one request: what to capture, how to steer, what to reduce in the worker.

The host builds them (`ie_vllm.host.admission`); the request carries its spec to every worker as
JSON in vLLM's per-request `extra_args` (`to_json`, each op as `Op.to_wire` writes it for HTTP),
and the worker rebuilds it (`from_json`) into its registry when the request first reaches a
forward (`ie_vllm.worker.extension`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ie_core.ops import SteeringOp, op_from_dict

__all__ = ["ReducerSpec", "RequestSpec", "SteerSpec"]


@dataclass(frozen=True)
class ReducerSpec:
    """`kind` applied to the rows of `address`; outputs are collected as `label|<output>`."""

    label: str
    kind: str
    address: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        return {"label": self.label, "kind": self.kind, "address": self.address,
                "params": dict(self.params)}  # fmt: skip

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> ReducerSpec:
        return cls(str(data["label"]), str(data["kind"]), str(data["address"]), data["params"])

    def group(self) -> str:
        """Jobs with equal groups run batched: same function, same parameters."""
        return self.kind + json.dumps(dict(self.params), sort_keys=True)


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
