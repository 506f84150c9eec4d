"""The steering checks every backend's admission runs, in one order, so no backend accepts a
spec another refuses: each spec's own check, then per address the backend's writable site, the
width the site fixes, the ops' values against the activations' dtype, and the points the ops'
conditions read (readable there, as wide as their probes).

A backend supplies `WriteSites` (how it finds a writable site and words its refusals) and maps
each `AdmittedWrite` to its own write (eager's hook, vLLM's worker spec).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ie_core.errors import SteeringSpecError
from ie_core.grammar import Address
from ie_core.ops import Steering
from ie_core.ops.apply import check_ops_fit
from ie_core.protocol import SteeringArg, steering_tuple

if TYPE_CHECKING:
    import torch

__all__ = ["AdmittedWrite", "WriteSites", "admit_writes", "check_row_steering"]


class WriteSites(Protocol):
    """A backend's side of the checks."""

    def check_spec(self, spec: Steering) -> None:
        """Refuse a spec the backend cannot run at all, before any of its addresses."""

    def writable_site(self, address: Address) -> tuple[Any, int | None]:
        """The backend's handle on `address` and its width (None: any width), or raise with
        the backend's reason when the address is unknown, unserved or not writable."""
        ...

    def readable_site(self, address: str) -> tuple[Any, int]:
        """The backend's handle on a point a condition reads and its width, or raise with the
        backend's reason when it cannot read it there."""
        ...


@dataclass(frozen=True)
class AdmittedWrite:
    """One address of one spec that passed: the spec, the address and the backend's site;
    `conditions` pairs each op judged at an earlier point (its index) with that point's site."""

    spec: Steering
    address: Address
    site: Any
    conditions: tuple[tuple[int, Any], ...] = ()


def admit_writes(
    steering: SteeringArg, sites: WriteSites, dtype: torch.dtype
) -> tuple[AdmittedWrite, ...]:
    """Every (spec, address) of `steering`, checked in the order the module docstring gives."""
    admitted: list[AdmittedWrite] = []
    for spec in steering_tuple(steering):
        sites.check_spec(spec)
        for address in spec.addresses():
            site, width = sites.writable_site(address)
            if width is not None:
                spec.check_width(width)
            check_ops_fit(spec.ops, dtype, str(address))
            conditions = _condition_sites(spec, str(address), sites)
            admitted.append(AdmittedWrite(spec, address, site, conditions))
    return tuple(admitted)


def _condition_sites(
    spec: Steering, address: str, sites: WriteSites
) -> tuple[tuple[int, Any], ...]:
    """Each op's condition checked against the point it reads; the earlier points' sites."""
    found: list[tuple[int, Any]] = []
    for j, op in enumerate(spec.ops):
        op.check_read(lambda read: sites.readable_site(read)[1])
        if (read := op.condition_read(address)) is not None:
            found.append((j, sites.readable_site(read)[0]))
    return tuple(found)


def check_row_steering(row_steering: Any, n_prompts: int) -> None:
    """Per-prompt steering names one entry (specs, or none) for each prompt of the batch."""
    if row_steering and len(row_steering) != n_prompts:
        raise SteeringSpecError(
            f"row_steering has {len(row_steering)} entries for {n_prompts} prompts; give one "
            "entry (a spec, a list of specs, or None) per prompt, in the batch's order"
        )
