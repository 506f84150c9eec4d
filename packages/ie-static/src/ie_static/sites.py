"""Which hook sites a declared set needs, read from ie-vllm's point table of the loaded model.

An address maps to one resolved site (several addresses may share one, e.g. `attn_out_post` is
`attn_out` on families without sandwich norms) or, for attention scores and probabilities, to the
post-RoPE q and k sites they are recomputed from (ie-vllm's `capture_sites`). Addresses the table
does not serve, or does not let write, are returned with the resolver's reason, not installed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ie_core.grammar import to_address
from ie_vllm import ATTN_POINTS, PointTable, capture_sites


@dataclass
class SitePlan:
    """Site names to tap (read buffers, write tables), per-address site names, refusals."""

    reads: dict[str, tuple[str, ...]] = field(default_factory=dict)  # address -> site names
    writes: dict[str, str] = field(default_factory=dict)  # address -> site name
    refused: dict[str, str] = field(default_factory=dict)  # address -> reason

    def read_site_names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s for names in self.reads.values() for s in names))

    def write_site_names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.writes.values()))


def _reason(table: PointTable, address: str, architecture: str) -> str:
    name = to_address(address).name
    return (
        table.refused.get(address)
        or table.refused.get(name)
        or f"{name} does not exist at this layer of {architecture} on vLLM"
    )


def _needs_companions(table: PointTable, address: str) -> str:
    """A refusal if the address's site reads another module's output too (a static tap sees one
    module's forward), else ''."""
    site = table.sites.get(table.addresses.get(address, ""))
    if site is None or not site.companions:
        return ""
    return (
        f"{address.split('.')[0]} is the sum of two modules' outputs that the layer adds inline (routed "
        "experts and a shared MLP); a static tap sits in one module's forward, so it cannot read "
        "or write the sum; use backend='vllm'"
    )


def plan_sites(
    table: PointTable, reads: Sequence[str], writes: Sequence[str], architecture: str
) -> SitePlan:
    """Resolve declared read and write addresses to the table's hook sites."""
    plan = SitePlan()
    for address in reads:
        if address not in table.widths:
            plan.refused[address] = _reason(table, address, architecture)
            continue
        if to_address(address).name in ATTN_POINTS:
            names = capture_sites(address)
            if not all(n in table.sites for n in names):
                plan.refused[address] = f"{address}: vLLM's attention layer has no q/k inputs here"
                continue
        elif why := _needs_companions(table, address):
            plan.refused[address] = why
            continue
        else:
            names = (table.addresses[address],)
        plan.reads[address] = names
    for address in writes:
        if address in plan.refused:
            continue
        if why := _needs_companions(table, address):
            plan.refused[address] = why
            continue
        if address not in table.writable:
            plan.refused[address] = (
                f"{address} is read only on {architecture}'s vLLM layers: the residual is kept "
                "outside the hooked module, so a write would not reach it"
                if address in table.widths
                else _reason(table, address, architecture)
            )
            continue
        plan.writes[address] = table.addresses[address]
    return plan


__all__ = ["SitePlan", "plan_sites"]
