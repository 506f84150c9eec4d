"""What crosses HTTP between `ie serve` and the `remote` backend: one source for both sides.

JSON for specs and sampling (plain data, validated again by the receiving constructors), and
safetensors for tensors (a standard binary format: every tensor named by its address, with dtype
and shape in the header). ie-core stays torch-free at import; the tensor codec imports torch and
safetensors when called.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ie_core.errors import SteeringSpecError, UnsupportedOperationError
from ie_core.ops import PositionMask, Steering, op_from_dict
from ie_core.protocol import SamplingParams, SteeringArg, steering_tuple

SAFETENSORS = "application/vnd.safetensors"
# The key a steered OpenAI request carries in `vllm_xargs` (a JSON string: vllm_xargs values
# must be strings, numbers or lists of them).
STEERING_XARG = "ie_steering"
# Keys the server sets itself; a client that sends them is refused (they would address another
# request's registration). The vLLM worker reads the request's registry key and its spec there.
KEY_XARG = "ie_key"
SPEC_XARG = "ie_spec"
SLOT_XARG = "ie_slot"  # vllm-static: the write-table slot the host gave a steered request
RESERVED_XARGS = (KEY_XARG, SPEC_XARG, SLOT_XARG)


@dataclass(frozen=True)
class Route:
    """One of `ie serve`'s own endpoints: the server mounts it, the remote backend calls it."""

    method: str
    path: str  # under PREFIX

    @property
    def url(self) -> str:
        return PREFIX + self.path


PREFIX = "/v1/ie"
ROUTES: Mapping[str, Route] = MappingProxyType(
    {
        "info": Route("GET", "/info"),
        "stats": Route("GET", "/stats"),
        "saes": Route("GET", "/saes"),
        "capture": Route("POST", "/capture"),
        "capture_generation": Route("POST", "/capture_generation"),
        "generate": Route("POST", "/generate"),
        "generate_stream": Route("POST", "/generate_stream"),
        "decode_residuals": Route("POST", "/decode_residuals"),
        "lens_topk": Route("POST", "/lens_topk"),
        "features": Route("POST", "/features"),
        "feature_op": Route("POST", "/feature_op"),
        "probe_scores": Route("POST", "/probe_scores"),
        "patchscope": Route("POST", "/patchscope"),
    }
)


def steering_to_wire(steering: SteeringArg) -> list[dict[str, Any]]:
    return [
        {
            "point": s.point,
            "layers": list(s.layers),
            "stream": s.stream,
            "ops": [op.to_wire() for op in s.ops],
            "mask": {
                "positions": list(s.mask.positions),
                "special_tokens": s.mask.special_tokens,
                "prefill_only": s.mask.prefill_only,
                "skip_bos": s.mask.skip_bos,
            },
        }
        for s in steering_tuple(steering)
    ]


def steering_from_wire(data: Any) -> tuple[Steering, ...]:
    """Specs from JSON data; every field goes through the same constructors as in-process."""
    if not isinstance(data, list):
        raise SteeringSpecError("steering must be a JSON list of specs")
    out = []
    for item in data:
        if not isinstance(item, dict):
            raise SteeringSpecError(f"a steering spec must be a JSON object, got {item!r:.80}")
        unknown = set(item) - {"point", "layers", "stream", "ops", "mask"}
        if unknown:
            raise SteeringSpecError(f"unknown steering spec fields {sorted(unknown)}")
        try:
            mask = item.get("mask") or {}
            ops = item["ops"]
            if not isinstance(ops, list) or not all(isinstance(op, dict) for op in ops):
                raise SteeringSpecError("ops must be a list of JSON objects")
            out.append(
                Steering(
                    item["point"],
                    tuple(item.get("layers") or ()),
                    tuple(op_from_dict(op) for op in ops),
                    PositionMask(
                        tuple(mask.get("positions", ())),
                        bool(mask.get("special_tokens", False)),
                        bool(mask.get("prefill_only", False)),
                        bool(mask.get("skip_bos", False)),
                    ),
                    item.get("stream"),
                )
            )
        except KeyError as exc:
            raise SteeringSpecError(f"a steering spec lacks the field {exc}") from None
        except (TypeError, AttributeError) as exc:
            raise SteeringSpecError(f"malformed steering spec: {exc}") from None
    return tuple(out)


def sampling_to_wire(sampling: SamplingParams) -> dict[str, Any]:
    data = dataclasses.asdict(sampling)
    if data.get("logprobs") is None:
        data.pop("logprobs", None)  # servers from before logprobs read the same JSON
    return data


def sampling_from_wire(data: Any) -> SamplingParams:
    if data is None:
        return SamplingParams()
    if not isinstance(data, dict):
        raise ValueError("sampling must be a JSON object")
    fields = {f.name for f in dataclasses.fields(SamplingParams)}
    unknown = set(data) - fields
    if unknown:
        raise ValueError(f"unknown sampling fields {sorted(unknown)}; known: {sorted(fields)}")
    if data.get("logprobs") is not None:
        # The HTTP responses carry tokens and text only: refuse rather than drop the logprobs.
        raise UnsupportedOperationError(
            "per-step logprobs are not carried over HTTP; load the model in-process "
            "(backend='vllm' or 'eager') for SamplingParams(logprobs=k)"
        )
    return SamplingParams(**data)


def encode_tensors(tensors: Mapping[str, Any], meta: Mapping[str, Any] | None = None) -> bytes:
    """Tensors by name as safetensors bytes; `meta` (JSON) rides in the header's metadata."""
    from safetensors.torch import save

    body = {name: t.detach().contiguous().cpu() for name, t in tensors.items()}
    return save(body, metadata={"ie": json.dumps(dict(meta or {}))})


def decode_tensors(data: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
    """(tensors by name, meta) from `encode_tensors` bytes."""
    from safetensors.torch import load

    tensors = load(data)
    header_len = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + header_len])
    meta = json.loads((header.get("__metadata__") or {}).get("ie", "{}"))
    return dict(tensors), meta


__all__ = [
    "KEY_XARG",
    "PREFIX",
    "RESERVED_XARGS",
    "ROUTES",
    "SAFETENSORS",
    "SLOT_XARG",
    "SPEC_XARG",
    "STEERING_XARG",
    "Route",
    "decode_tensors",
    "encode_tensors",
    "sampling_from_wire",
    "sampling_to_wire",
    "steering_from_wire",
    "steering_to_wire",
]
