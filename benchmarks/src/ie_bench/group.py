"""One model's variants in one process, measured round-robin over repeats.

Each engine loads once and stays loaded while the others run; then every workload runs its warm-up
and its repeats in rounds (variant A repeat 1, B repeat 1, ..., A repeat 2, ...), so a ratio between
two variants compares them under one condition even while the machine's load moves. Every cell
still records its own load: at its start, sampled during the rounds, at the end, and at each step.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from time import sleep
from typing import Any

import psutil
from ie_core.tooling.load_sampling import LoadSampler

from ie_bench.cell import (
    cuda_refusal,
    finish,
    load,
    not_run,
    prepare,
    record_capture_dtype,
    record_outcome,
    skeleton,
)
from ie_bench.cells import cell_path, write_cell
from ie_bench.spec import WORKLOADS, ModelSpec, Profile, VariantSpec, one_engine_at_a_time

GIB = 1024**3
SCHEDULE = "round-robin"


@dataclass(frozen=True)
class Step:
    """One call of a workload on one variant; warm-ups are run and not kept."""

    workload: str
    variant: str
    repeat: int
    warmup: bool


def round_robin(variants: list[str], workloads: list[str], warmup: int, repeats: int) -> list[Step]:
    """The order of execution: per workload, warm-ups then repeats, each a round over variants."""
    steps: list[Step] = []
    for workload in workloads:
        for n, is_warmup in [(warmup, True), (repeats, False)]:
            for repeat in range(n):
                steps += [Step(workload, v, repeat, is_warmup) for v in variants]
    return steps


@dataclass
class Member:
    """A loaded variant of the group: its cell, its model and its workloads' tallies."""

    variant: VariantSpec
    cell: dict[str, Any]
    path: Path
    model: Any
    ctx: Any
    tallies: dict[str, Any] = field(default_factory=dict)


def _memory_error(profile: Profile, loaded: int) -> dict[str, Any] | None:
    free = psutil.virtual_memory().available / GIB
    if free >= profile.min_free_gib:
        return None
    return {
        "type": "NotEnoughMemory",
        "message": f"{free:.1f} GiB available with {loaded} engine(s) of this model loaded, and "
        f"profile {profile.name!r} needs {profile.min_free_gib:g} GiB per engine; the interleaved "
        "sweep holds every variant's engine at once, so run this model with "
        "`ie bench sweep --separate` (one process per cell, not interleaved)",
    }


def _load_member(
    model_spec: ModelSpec, variant: VariantSpec, profile: Profile, cell: dict[str, Any], path: Path
) -> Member | None:
    """Load and warm one variant; a failure is recorded in its cell and the group goes on."""
    from ie_core.runner import run

    model = None
    try:
        model = load(cell, path, model_spec, variant, profile)
        ctx = run(prepare(cell, path, model, model_spec, profile))
    except Exception as exc:
        cell["error"] = {"type": type(exc).__name__, "message": str(exc)}
        if model is not None:
            with contextlib.suppress(Exception):
                run(model.shutdown())
        return None
    return Member(variant, cell, path, model, ctx)


def _rounds(members: list[Member], workloads: list[str], profile: Profile) -> None:
    from ie_core.runner import run

    from ie_bench.workloads import Tally

    by_key = {m.variant.key: m for m in members}
    for m in members:
        m.tallies = {name: Tally(name) for name in workloads}
        m.cell["environment"]["loadavg_steps"] = []
    order = round_robin(list(by_key), workloads, profile.warmup, profile.repeats)
    for step in order:
        m = by_key[step.variant]
        if not step.warmup and len(by_key) > 1:
            sleep(profile.settle_s)  # let the previous variant's engine go idle
        m.cell["environment"]["loadavg_steps"].append(round(os.getloadavg()[0], 2))
        run(m.tallies[step.workload].step(m.ctx, step.warmup))
    for m in members:
        for name in workloads:
            record_outcome(m.cell, name, run(m.tallies[name].outcome(m.ctx)))
        record_capture_dtype(m.cell, m.ctx)


def check_one_engine(variants: list[VariantSpec], profile: Profile) -> None:
    """Refuse a group that would hold two engines where the profile allows one at a time."""
    if one_engine_at_a_time(profile) and len(variants) > 1:
        raise ValueError(
            f"profile {profile.name!r} holds one engine at a time (a CUDA engine reserves its "
            f"share of the device), and a group keeps {len(variants)} loaded together; run "
            "`ie bench sweep` (one process per cell on this profile) or one variant per group"
        )


def run_group(
    model_spec: ModelSpec,
    variants: list[VariantSpec],
    profile: Profile,
    cells_dir: Path,
    workloads: list[str] | None = None,
    command: list[str] | None = None,
) -> list[dict[str, Any]]:
    """Measure every variant of one model interleaved; write and return their cells."""
    from ie_core.runner import run

    names = workloads or [w.key for w in WORKLOADS]
    check_one_engine(variants, profile)
    if profile.torch_threads:
        import torch

        torch.set_num_threads(profile.torch_threads)
    cells: list[tuple[dict[str, Any], Path]] = []
    members: list[Member] = []
    schedule = {"kind": SCHEDULE, "variants": [v.key for v in variants]}
    try:
        for variant in variants:
            path = cell_path(cells_dir, profile.name, model_spec.key, variant.key)
            cell = skeleton(model_spec, variant, profile, command or [])
            cell["environment"]["schedule"] = schedule
            cells.append((cell, path))
            write_cell(path, cell)
            cell["error"] = _memory_error(profile, len(members)) or cuda_refusal(variant, profile)
            if cell["error"] is None and (
                m := _load_member(model_spec, variant, profile, cell, path)
            ):
                members.append(m)
        with LoadSampler() as sampler:
            _rounds(members, names, profile)
        for m in members:
            m.cell["environment"]["loadavg_during"] = sampler.summary()
    finally:
        for m in members:
            with contextlib.suppress(Exception):
                run(m.model.shutdown())
        for cell, path in cells:
            cell["environment"]["schedule"] = schedule
            for name in names:
                cell["workloads"].setdefault(name, not_run(cell["error"]))
            finish(cell)
            write_cell(path, cell)
    return [cell for cell, _ in cells]


__all__ = ["SCHEDULE", "Step", "round_robin", "run_group"]
