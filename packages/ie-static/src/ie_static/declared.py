"""The sites a vllm-static engine declares at load: `static_points` / `static_writes` -> addresses.

What can be tapped comes from `ie_static.serving` (vllm-static serves what hooked
vLLM serves from a module input or output, and attention maps recomputed from tapped q and k).
Whether this model has an address is the resolver's answer on the loaded model: addresses named
one by one must resolve there or the load is refused; expansions (`'all'`, bare point names) keep
what the model has.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ie_core.errors import PointUnavailableError, UnsupportedModelError
from ie_core.grammar import POINTS, Family, Point, check_layer, get_point, spelled_point, to_address

from ie_static.serving import static_serving
from ie_static.tap_info import TapInfo

BACKEND = "vllm-static"
TAPPABLE: tuple[str, ...] = tuple(p.name for p in POINTS if static_serving(p).served)


@dataclass(frozen=True)
class Declared:
    """Declared read and write addresses; `named_*` were named one by one (must resolve)."""

    reads: tuple[str, ...]
    writes: tuple[str, ...]
    named_reads: frozenset[str] = frozenset()
    named_writes: frozenset[str] = frozenset()


def _refuse(point: Point, label: str, family: Family | None) -> None:
    serving = static_serving(point)
    if not serving.served:
        raise PointUnavailableError(
            f"{label}: vllm-static does not serve {point.name}: {serving.reason}"
        )
    if family is not None and not family.has_point(point):
        raise PointUnavailableError(f"{label}: {family.missing_reason(point)}")


def _every(point: Point, n_layers: int) -> list[str]:
    return [f"{point.name}.{i}" for i in range(n_layers)] if point.per_layer else [point.name]


def expand_points(
    spec: Any, n_layers: int, label: str, family: Family | None = None
) -> tuple[tuple[str, ...], frozenset[str]]:
    """`'all'`, or a list of addresses / bare point names -> (addresses, the ones named singly)."""
    if spec == "all":
        points = [p for p in POINTS if p.name in TAPPABLE]
        if family is not None:
            points = [p for p in points if family.has_point(p)]
        return tuple(a for p in points for a in _every(p, n_layers)), frozenset()
    if isinstance(spec, str):
        raise ValueError(f"{label} must be 'auto', 'all' or a list of addresses, got {spec!r}")
    out: list[str] = []
    named: set[str] = set()
    for item in spec:
        bare = spelled_point(item)  # ours or a TL / nnterp spelling, e.g. `hook_resid_post`
        if bare is not None or (isinstance(item, str) and "." not in item):
            point = get_point(bare or item)
            _refuse(point, label, family)
            out.extend(_every(point, n_layers))
            if not point.per_layer:
                named.add(point.name)
            continue
        address = to_address(item, check=True)
        if address.is_path:
            raise PointUnavailableError(
                f"{label}: {address} is a raw module path; vllm-static taps points only"
            )
        _refuse(get_point(address.name), label, family)
        if address.stream is not None:
            raise PointUnavailableError(
                f"{label}: {address} has a stream; this model has one stream"
            )
        check_layer(address, n_layers, label)
        out.append(str(address))
        named.add(str(address))
    return tuple(dict.fromkeys(out)), frozenset(named)


def _writable(address: str) -> bool:
    return get_point(to_address(address).name).writable


def declared_sets(
    static_points: Any, static_writes: Any, n_layers: int, family: Family | None = None
) -> Declared:
    """Reads (`'auto'` = resid_post at every layer) and writes (`'auto'` = every writable read)."""
    if static_points == "auto":
        reads, named_reads = tuple(f"resid_post.{i}" for i in range(n_layers)), frozenset()
    else:
        reads, named_reads = expand_points(static_points, n_layers, "static_points", family)
    if not reads:
        raise ValueError("static_points is empty; declare at least one site (or 'auto')")
    if static_writes == "auto":
        return Declared(reads, tuple(a for a in reads if _writable(a)), named_reads)
    writes, named_writes = expand_points(static_writes, n_layers, "static_writes", family)
    capture_only = [w for w in writes if not _writable(w)]
    if capture_only:
        raise PointUnavailableError(
            f"static_writes {capture_only} are capture-only points and cannot be steered"
        )
    outside = [w for w in writes if w not in reads]
    if outside:
        raise ValueError(
            f"static_writes {outside} are not among static_points; a write site must also be "
            "declared in static_points"
        )
    return Declared(reads, writes, named_reads, named_writes)


def unresolved(declared: Declared, info: TapInfo) -> dict[str, str]:
    """Singly named addresses the loaded model did not tap (-> the resolver's reason)."""
    missing = (declared.named_reads - set(info.reads)) | (declared.named_writes - set(info.writes))
    return {a: info.refused.get(a, "not tapped") for a in sorted(missing)}


def describe(addresses: Sequence[str]) -> str:
    """`resid_post at layers 0..29` style summary of a declared set."""
    if not addresses:
        return "nothing"
    by_point: dict[str, list[int]] = {}
    trunk: list[str] = []
    for a in addresses:
        addr = to_address(a)
        if addr.layer is None:
            trunk.append(addr.name)
            continue
        by_point.setdefault(addr.name, []).append(addr.layer)
    parts = list(dict.fromkeys(trunk))
    for name, layers in by_point.items():
        layers = sorted(layers)
        if layers == list(range(layers[0], layers[-1] + 1)) and len(layers) > 2:
            parts.append(f"{name} at layers {layers[0]}..{layers[-1]}")
        else:
            parts.append(f"{name} at layers {', '.join(map(str, layers))}")
    return "; ".join(parts)


def refuse_unresolved(declared: Declared, info: TapInfo, architecture: str) -> None:
    """Singly named sites the loaded model lacks are refused (before any request runs)."""
    missing = unresolved(declared, info)
    if missing:
        lines = "; ".join(f"{a}: {why}" for a, why in missing.items())
        raise PointUnavailableError(
            f"vllm-static cannot tap these declared sites on {architecture}: {lines}; "
            "declare only sites this model has (bare point names and 'all' keep what it has), "
            "or use backend='vllm'"
        )
    if not info.reads:
        reasons = set(info.refused.values())
        if len(reasons) == 1:
            # Every point refused for one reason (ie-vllm has no map of this architecture): the
            # backend cannot serve the model at all, and says why as hooked vLLM does per point.
            raise UnsupportedModelError(reasons.pop())
        raise PointUnavailableError(
            f"none of the declared static_points exist on {architecture}; "
            f"refused: {dict(info.refused)}"
        )


__all__ = [
    "TAPPABLE",
    "Declared",
    "declared_sets",
    "describe",
    "expand_points",
    "refuse_unresolved",
    "unresolved",
]
