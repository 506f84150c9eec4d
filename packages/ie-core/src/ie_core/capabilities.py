"""What each backend serves on each family, and why not: the value a backend's `capabilities()`
returns, and the committed answers of the capability sweeps (`ie_core/data/capabilities/`).

The committed files are written by `ie points --sweep`, which loads each synthetic family on a
backend and captures every point that backend claims, so "served" there means a capture returned
a finite tensor. The cheat sheet (docs, dashboard) renders only from these answers; a family a
backend was never swept on is "not verified", never a check mark. Torch-free.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib.resources import files
from typing import Any

from ie_core.errors import PointUnavailableError
from ie_core.grammar import POINTS, Address, Service, Serving

SCHEMA = 1
_COMMITTED = files("ie_core") / "data" / "capabilities"
# The backends with committed answers, one file each: the files are the one source of the list.
BACKENDS: tuple[str, ...] = tuple(
    sorted(p.name.removesuffix(".json") for p in _COMMITTED.iterdir() if p.name.endswith(".json"))
)
SYNTHETIC_PREFIX = "ie-synthetic/"
NOT_VERIFIED = "not verified"
SERVED = "served"
REFUSED = "refused"


@dataclass(frozen=True)
class PointCapability:
    """One point on one loaded model: served on `layers` (() for trunk points), writable there,
    and `reason` saying why not where it is refused (empty when served on every layer)."""

    served: bool
    writable: bool
    layers: tuple[int, ...]
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "served": self.served,
            "writable": self.writable,
            "layers": list(self.layers),
            "reason": self.reason,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PointCapability:
        return cls(
            bool(data["served"]),
            bool(data["writable"]),
            tuple(int(i) for i in data["layers"]),
            str(data["reason"]),
        )


Capabilities = dict[str, PointCapability]


def probe(
    n_layers: int,
    check: Callable[[Address], Any],
    writable: Callable[[Address, Any], bool],
) -> Capabilities:
    """A backend's capabilities from its own resolver: `check(address)` returns what the address
    resolves to or raises PointUnavailableError; `writable(address, resolved)` says whether a
    write reaches it. Reasons are the errors' own `reason` (the why without the address, so one
    reason covers every layer it refuses)."""
    out: Capabilities = {}
    for point in POINTS:
        addresses = (
            [Address(point.name, i) for i in range(n_layers)]
            if point.per_layer
            else [Address(point.name)]
        )
        layers: list[int] = []
        writes: list[bool] = []
        refused: dict[str, list[int | None]] = {}  # reason -> the layers it refuses
        for address in addresses:
            try:
                resolved = check(address)
            except PointUnavailableError as exc:
                text = same_reason(address, exc.reason)
                refused.setdefault(text, []).append(address.layer)
                continue
            if address.layer is not None:
                layers.append(address.layer)
            writes.append(writable(address, resolved))
        out[point.name] = PointCapability(
            bool(writes), bool(writes) and all(writes), tuple(layers), _join(refused, bool(writes))
        )
    return out


def same_reason(address: Address, text: str) -> str:
    """A refusal with its own layer number said as "this layer", so one reason covers many."""
    if address.layer is None:
        return text
    return text.replace(f"layer {address.layer} ", "this layer ")


def _join(refused: Mapping[str, list[int | None]], partly_served: bool) -> str:
    if len(refused) == 1 and not partly_served:
        return next(iter(refused))
    parts = []
    for text, layers in refused.items():
        named = ", ".join(str(i) for i in layers)
        parts.append(f"layer{'s' if len(layers) > 1 else ''} {named}: {text}")
    return "; ".join(parts)


# ---------------------------------------------------------------- committed answers


@dataclass(frozen=True)
class CapabilityFile:
    """One backend's committed sweep: per model id, its family and per point its capability."""

    backend: str
    command: str
    versions: Mapping[str, str]
    models: Mapping[str, tuple[str, Capabilities]]  # model id -> (family slug, points)
    # How the backend's plugin is designed to reach each point (hook, recompute, tap, or why
    # not), recorded so readers without the backend installed (the dashboard) can say it.
    declared: Mapping[str, Serving] = field(default_factory=dict)

    def for_family(self, family: str) -> Capabilities | None:
        for slug, points in self.models.values():
            if slug == family:
                return points
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "backend": self.backend,
            "command": self.command,
            "versions": dict(self.versions),
            "models": {
                model: {
                    "family": slug,
                    "points": {name: cap.to_json() for name, cap in points.items()},
                }
                for model, (slug, points) in self.models.items()
            },
            "declared": {
                name: {"service": s.service.value, "reason": s.reason}
                for name, s in self.declared.items()
            },
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1) + "\n"


def parse_capabilities(data: Mapping[str, Any]) -> CapabilityFile:
    if data.get("schema") != SCHEMA:
        raise ValueError(
            f"capability file schema {data.get('schema')!r}; this reader reads {SCHEMA}"
        )
    models = {
        model: (
            str(entry["family"]),
            {name: PointCapability.from_json(c) for name, c in entry["points"].items()},
        )
        for model, entry in data["models"].items()
    }
    declared = {
        name: Serving(Service(s["service"]), str(s["reason"]))
        for name, s in data.get("declared", {}).items()
    }
    return CapabilityFile(
        str(data["backend"]),
        str(data.get("command", "")),
        dict(data.get("versions", {})),
        models,
        declared,
    )


def capability_path(backend: str) -> Any:
    """The committed file of `backend` (a Traversable inside the installed ie-core)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; capability answers exist for {BACKENDS}")
    return _COMMITTED / f"{backend}.json"


@cache
def load_capabilities(backend: str) -> CapabilityFile | None:
    """The committed answers of `backend`, or None when it was never swept."""
    path = capability_path(backend)
    if not path.is_file():
        return None
    return parse_capabilities(json.loads(path.read_text()))


def verdict(cap: PointCapability | None) -> str:
    """`served`, `refused: <reason>` or `not verified` for one answer (None = no answer)."""
    if cap is None:
        return NOT_VERIFIED
    if cap.served:
        return SERVED
    return f"{REFUSED}: {cap.reason}"


def cell(backend: str, family: str, point: str) -> str:
    """What the committed sweep of `backend` says about `point` on `family`."""
    answers = load_capabilities(backend)
    points = answers.for_family(family) if answers is not None else None
    return verdict(points.get(point) if points is not None else None)


def declared_serving(backend: str, point: str) -> Serving | None:
    """How `backend`'s plugin is designed to reach `point`, as its committed sweep recorded it
    (None where no sweep recorded it); no backend package needs to be installed."""
    answers = load_capabilities(backend) if backend in BACKENDS else None
    return answers.declared.get(point) if answers is not None else None


def family_capabilities(backend: str, family: str) -> Capabilities | None:
    answers = load_capabilities(backend)
    return answers.for_family(family) if answers is not None else None
