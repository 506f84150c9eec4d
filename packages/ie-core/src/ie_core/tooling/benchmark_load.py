"""The publish gate of benchmark figures: cells measured while other work shared the machine.

Every benchmark cell records the 1-minute load average before, during (sampled) and after its
workloads, and, sampled during them, how many threads of processes outside the benchmark's own
process tree were runnable. Where that count was recorded, it is the test: the load average also
counts the benchmark's engine, workers and client, which an interleaved group of several resident
engines pushes past one per core on a machine doing nothing else. Older cells are judged by the
load average. A sweep passes when every cell is within the bound and the cells of one model ran
under comparable load, so that a ratio between variants compares backends, not load. ie-bench
refuses to publish a failing sweep as the headline; the dashboard marks its cells.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The benchmark itself keeps the cores busy (a vLLM engine runs a worker and a front-end), so the
# bound is one runnable process per core: anything above it means another job was competing.
MAX_LOAD_PER_CORE = 1.0
# Peaks of one model's cells may differ by at most this much 1-minute load.
MAX_SPREAD = 1.0
# Other processes' runnable threads, averaged over the cell's samples: a quarter of a core.
MAX_FOREIGN = 0.25


@dataclass(frozen=True)
class CellLoad:
    """The highest 1-minute load a cell saw, and whether it is within the bound."""

    cell_id: str
    model: str
    cores: int
    peak: float  # highest 1-minute load seen before, during or after the cell
    foreign: float | None = None  # mean runnable threads of other processes, where recorded

    @property
    def within_bound(self) -> bool:
        if self.foreign is not None:
            return self.foreign <= MAX_FOREIGN
        return self.peak <= MAX_LOAD_PER_CORE * self.cores

    def label(self) -> str:
        if self.foreign is not None:
            return f"other work {self.foreign:.2f} threads; 1-min load {self.peak:.1f} on {self.cores} cores"
        return f"1-min load {self.peak:.1f} on {self.cores} cores"

    def problem(self) -> str:
        if self.foreign is not None:
            return (
                f"{self.cell_id} shared the machine: on average {self.foreign:.2f} threads of "
                f"other processes were runnable (bound {MAX_FOREIGN:g})"
            )
        return (
            f"{self.cell_id} ran at 1-minute load {self.peak:.2f} on {self.cores} cores "
            f"(bound {MAX_LOAD_PER_CORE * self.cores:.2f})"
        )


@dataclass(frozen=True)
class Verdict:
    passed: bool
    reasons: tuple[str, ...]
    peak: float
    cores: int

    def as_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "reasons": list(self.reasons),
            "peak_load_1m": self.peak,
            "cores": self.cores,
            "bound": f"other processes' runnable threads <= {MAX_FOREIGN:g} on average in "
            f"every cell; cells without that count: 1-minute load <= {MAX_LOAD_PER_CORE:g} x "
            f"cores, peaks of one model's cells within {MAX_SPREAD:g}",
        }


def cell_load(cell: dict[str, Any]) -> CellLoad | None:
    """The peak load a cell recorded, or None when it recorded none (it cannot pass the gate)."""
    env = cell["environment"]
    seen = [float(env[k][0]) for k in ("loadavg_start", "loadavg", "loadavg_end") if env.get(k)]
    during = env.get("loadavg_during") or {}
    if during.get("max_1m") is not None:
        seen.append(float(during["max_1m"]))
    if not seen:
        return None
    cores = int(env.get("cpu_count") or 1)
    foreign = during.get("foreign_mean")
    return CellLoad(
        cell["cell_id"],
        cell["model"]["key"],
        cores,
        max(seen),
        None if foreign is None else float(foreign),
    )


def judge(cells: list[dict[str, Any]]) -> Verdict:
    """Whether these cells may be published as the headline, with the reasons when not."""
    reasons: list[str] = []
    loads: list[CellLoad] = []
    for cell in cells:
        load = cell_load(cell)
        if load is None:
            reasons.append(f"{cell['cell_id']} recorded no load average")
        else:
            loads.append(load)
    for load in loads:
        if not load.within_bound:
            reasons.append(load.problem())
    for model in sorted({load.model for load in loads}):
        mine = [load for load in loads if load.model == model]
        if all(load.foreign is not None for load in mine):
            continue  # each within MAX_FOREIGN already bounds the spread of competing work
        peaks = [load.peak for load in mine]
        if max(peaks) - min(peaks) > MAX_SPREAD:
            reasons.append(
                f"{model}'s cells ran at different loads ({min(peaks):.2f} to {max(peaks):.2f}), "
                "so their ratios mix load with backend"
            )
    peak = max((load.peak for load in loads), default=0.0)
    cores = max((load.cores for load in loads), default=0)
    return Verdict(not reasons, tuple(reasons), peak, cores)


__all__ = [
    "MAX_FOREIGN",
    "MAX_LOAD_PER_CORE",
    "MAX_SPREAD",
    "CellLoad",
    "Verdict",
    "cell_load",
    "judge",
]
