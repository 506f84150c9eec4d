"""Conditions judged at an earlier site than their write, within one forward.

A `Conditional` written at one site may read another point computed before it (`read`): at
registration each such op becomes a `Judge` at the reading site; in the forward, that site's hook
stores where the condition held for the request's rows, and the writing site takes it (once).
"""

from __future__ import annotations

import torch

from ie_vllm.specs import RequestSpec
from ie_vllm.worker.point_table import PointTable
from ie_vllm.worker.registry import Entry, Judge, Registry

# (request key, writing site, steering step there, op index) -> bool per row of this forward.
Held = dict[tuple[str, str, int, int], torch.Tensor]


def judges_of(table: PointTable, spec: RequestSpec) -> dict[str, tuple[Judge, ...]]:
    """Per earlier site, the conditions judged there for this request's writes at later sites;
    raises (the request is refused) where this worker cannot order the two hooks."""
    judges: dict[str, tuple[Judge, ...]] = {}
    steps: dict[str, int] = {}
    for s in spec.steering:
        site = table.addresses.get(s.address)
        if site is None:
            continue  # another pipeline stage writes it
        step = steps.get(site, 0)
        steps[site] = step + 1
        for j, op in enumerate(s.ops):
            read = op.condition_read(s.address)
            if read is None:
                continue
            at = table.addresses.get(read)
            if at is None:
                raise ValueError(
                    f"the condition for {s.address} reads {read}, which another pipeline stage "
                    "computes; read a point on the same stage, or load without pipeline "
                    "parallelism"
                )
            here, there = table.sites[site], table.sites[at]
            if here.module is there.module and here.hook == there.hook:
                # Two hooks of one module call run in the order they were installed, not the
                # forward's: the condition could be judged after the write.
                raise ValueError(
                    f"the condition for {s.address} reads {read}, which this worker reads in the "
                    "same module call it writes at; read a point of an earlier module"
                )
            judges[at] = (*judges.get(at, ()), Judge(site, step, j, op))
    return judges


def held_for(
    held: Held, registry: Registry, entry: Entry, site: str, step: int
) -> dict[int, torch.Tensor] | None:
    """The conditions of one steering step judged earlier in this forward, by op index; None
    (and the request refused, its collect raising why) where one was not judged: no
    half-steered rows, and no exception inside vLLM's forward."""
    key = entry.spec.key
    out: dict[int, torch.Tensor] = {}
    for at, judges in entry.judge_sites.items():
        for jd in judges:
            if jd.site != site or jd.step != step:
                continue
            got = held.pop((key, site, step, jd.op_index), None)
            if got is None:
                registry.refused[key] = (
                    f"the condition for the write at {site} reads {at}, which this model did not "
                    "compute before it in the forward; read a point of an earlier layer"
                )
                return None
            out[jd.op_index] = got
    return out


__all__ = ["Held", "held_for", "judges_of"]
