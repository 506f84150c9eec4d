"""What a hooked vLLM model serves, per point, derived from its point table's `info()`.

Kept as plain data (the format agreed for committed capability files: served, writable, served
layers, reason) so a model's `capabilities()` method and the family sweep share one derivation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ie_core.points import POINTS

__all__ = ["Capability", "capabilities"]


@dataclass(frozen=True)
class Capability:
    """One point on one model: served (on `layers`, `()` for non-layer points) or why not."""

    served: bool
    writable: bool
    layers: tuple[int, ...]
    reason: str

    def as_json(self) -> dict[str, Any]:
        return {
            "served": self.served,
            "writable": self.writable,
            "layers": list(self.layers),
            "reason": self.reason,
        }


def capabilities(info: dict[str, Any]) -> dict[str, Capability]:
    """Every standardized point (bare name) -> what the table behind `info` serves.

    A layer point is served on the layers that have an address in `widths`; its reason is the
    bare-name refusal, or the first per-layer refusal when only some layers serve it.
    """
    widths: dict[str, int] = info.get("widths", {})
    writable = set(info.get("writable", ()))
    refused: dict[str, str] = info.get("refused", {})
    out: dict[str, Capability] = {}
    for p in POINTS:
        addresses = [a for a in widths if a.partition(".")[0] == p.name]
        layers = tuple(sorted(int(a.partition(".")[2]) for a in addresses if "." in a))
        served = bool(addresses) and p.name not in refused
        layer_reasons = [
            r for a, r in refused.items() if a.partition(".")[0] == p.name and "." in a
        ]
        if served:
            reason = layer_reasons[0] if layer_reasons else ""
        else:
            reason = refused.get(p.name) or (layer_reasons[0] if layer_reasons else "not served")
            layers = ()
        out[p.name] = Capability(
            served=served,
            writable=served and any(a in writable for a in addresses),
            layers=layers,
            reason=reason,
        )
    return out
