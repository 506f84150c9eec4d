"""What every engine adapter shares: the request, the model spec and canonical layout."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from ie_core.grammar import Address, Width, get_point

from ie_validator.mappings import Gap, Hook, lookup
from ie_validator.scoring import Tier


@dataclass(frozen=True)
class ModelSpec:
    """One model as the sweep sees it: its id, local folder, table key and depth, and its
    quantization scheme (`w8a8`, `w4a16`, `fp8`; empty for a full-precision checkpoint)."""

    hf_id: str
    path: Path
    family: str
    architecture: str
    n_layers: int
    quantization: str = ""


@dataclass(frozen=True)
class Request:
    """One canonical address and the engine's name for it (formatted for the layer)."""

    address: Address
    hook: str
    layout: str = ""

    @property
    def key(self) -> str:
        return str(self.address)


@dataclass(frozen=True)
class CaptureFailure:
    """The engine was asked for a point it names and raised or returned no tensor: a FAIL."""

    reason: str


Capture = dict[str, "np.ndarray | Gap | CaptureFailure"]


class Engine(Protocol):
    name: str
    tier: Tier

    def capture(
        self, model: ModelSpec, ids: Sequence[int], requests: Sequence[Request]
    ) -> Capture: ...


@dataclass
class EngineError(Exception):
    """The engine could not run on this model at all (load failure, missing environment)."""

    message: str
    detail: str = field(default="")

    def __str__(self) -> str:
        return self.message


def plan(
    engine: str, model: ModelSpec, addresses: Sequence[Address]
) -> tuple[list[Request], Capture]:
    """Split addresses into requests the engine can name and declared gaps."""
    requests: list[Request] = []
    gaps: Capture = {}
    for address in addresses:
        entry = lookup(engine, model.family, address.name)
        if isinstance(entry, Gap):
            gaps[str(address)] = entry
        else:
            assert isinstance(entry, Hook)
            requests.append(Request(address, entry.at(address.layer), entry.layout))
    return requests, gaps


def is_attention_map(point: str) -> bool:
    return get_point(point).width is Width.HQK


def canonical(point: str, tensor: Any, layout: str = "") -> np.ndarray:
    """float64 numpy in canonical layout: `[b, s, width]` (per-head dims flattened), or
    `[b, heads, q, k]` for attention maps; `[b * s, w]` router outputs become `[1, b * s, w]`."""
    if isinstance(tensor, tuple | list):
        raise TypeError(f"got a {type(tensor).__name__} of {len(tensor)}, not a tensor")
    if hasattr(tensor, "detach"):
        tensor = tensor.detach().to("cpu").double().numpy()
    arr = np.asarray(tensor, dtype=np.float64)
    if layout == "bhsd" and arr.ndim == 4:
        arr = arr.transpose(0, 2, 1, 3)
    if is_attention_map(point):
        return arr
    if arr.ndim == 2:
        return arr.reshape(1, *arr.shape)
    if arr.ndim >= 3:
        return arr.reshape(arr.shape[0], arr.shape[1], -1)
    return arr
