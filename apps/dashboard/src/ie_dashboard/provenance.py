"""Where the figures on the throughput and validation pages came from, for the page footer.

Every stored row records its source: a results file's path relative to the folder it was seeded
from (`ie dashboard seed --root DIR`), or `api` for a POST. The footer counts them by folder, so a
page never claims results it does not hold.
"""

from __future__ import annotations

import posixpath
from collections import Counter
from dataclasses import dataclass

from sqlmodel import Session, select

from ie_dashboard.tables import BenchmarkCellRow, ValidatorRunRow, WorkloadRecordRow

LOAD_COMMAND = "ie dashboard seed --root PATH"
MAX_LISTED = 3  # source folders named one by one in the footer; more are summed under their parent


@dataclass(frozen=True)
class Provenance:
    """Row counts by source folder (`benchmarks/cells`, `api`, ...) for one kind of result."""

    kind: str  # "benchmark cells" | "validator results"
    by_source: tuple[tuple[str, int], ...]

    @property
    def total(self) -> int:
        return sum(n for _, n in self.by_source)

    def sentence(self) -> str:
        if not self.by_source:
            return f"no {self.kind} loaded (load a results folder with `{LOAD_COMMAND}`)"
        api = [n for where, n in self.by_source if where == "api"]
        files = [(where, n) for where, n in self.by_source if where != "api"]
        parts = [f"{api[0]} POSTed to the API"] if api else []
        if len(files) > MAX_LISTED:  # one folder per model: name their parent, not 34 paths
            parent = posixpath.commonpath([where for where, _ in files]) or "."
            count = sum(n for _, n in files)
            parts.append(f"{count} from {len(files)} folders under {parent}/")
        else:
            parts += [f"{n} from {where}/" for where, n in files]
        return f"{self.total} {self.kind}: {', '.join(parts)}"


def _folder(source: str) -> str:
    """`benchmarks/cells/a.json` -> `benchmarks/cells`; `api` stays `api`."""
    head, _, _ = source.rpartition("/")
    return head or source or "unknown"


def _count(sources: list[str], kind: str) -> Provenance:
    counts = Counter(_folder(s) for s in sources)
    return Provenance(kind, tuple(sorted(counts.items())))


def benchmark_provenance(session: Session) -> Provenance:
    return _count(list(session.exec(select(BenchmarkCellRow.source)).all()), "benchmark cells")


@dataclass(frozen=True)
class Joined:
    """Several kinds on one page (the throughput page: cells, then workload records)."""

    parts: tuple[Provenance, ...]

    def sentence(self) -> str:
        shown = [p for p in self.parts if p.by_source] or list(self.parts[:1])
        return "; ".join(p.sentence() for p in shown)


def throughput_provenance(session: Session) -> Joined:
    # One record file gives one or more cards; the footer counts files.
    records = sorted(set(session.exec(select(WorkloadRecordRow.source)).all()))
    return Joined((benchmark_provenance(session), _count(records, "workload records")))


def validator_provenance(session: Session) -> Provenance:
    return _count(list(session.exec(select(ValidatorRunRow.source)).all()), "validator results")


__all__ = [
    "LOAD_COMMAND",
    "Joined",
    "Provenance",
    "benchmark_provenance",
    "throughput_provenance",
    "validator_provenance",
]
