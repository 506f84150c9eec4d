"""Seed or refresh the database: the registry from ie-core, results from the committed JSON.

Benchmark cells come from `benchmarks/cells/`, validator results from `validator/results/`
(see those folders' READMEs), workload records from the files `records.RECORDS` names. Ingest
is idempotent, so re-seeding refreshes without duplicates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ie_core.tooling.records import BenchmarkCell, ValidatorResult
from pydantic import BaseModel, ValidationError
from sqlmodel import select

from ie_dashboard.body import BodyError, parse_json
from ie_dashboard.db import Database
from ie_dashboard.ingest import replace_record, upsert_cell, upsert_validator
from ie_dashboard.records import RECORDS, RecordError, read_record
from ie_dashboard.registry import seed_registry
from ie_dashboard.tables import BenchmarkCellRow, ValidatorRunRow

BENCH_DIR = Path("benchmarks/cells")
VALIDATOR_DIR = Path("validator/results")
# Keys that mark a JSON object as a cell / a result; other JSON there (reports, aggregates) is skipped.
BENCH_MARK = ("schema", "cell_id", "workloads")
VALIDATOR_MARK = ("hf_id", "engine")


@dataclass
class SeedReport:
    architectures: int = 0
    cells: int = 0
    results: int = 0
    records: int = 0  # workload record files read (each gives one or more page sections)
    skipped: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def summary(self) -> str:
        lines = [
            f"registry: {self.architectures} architectures; "
            f"benchmark cells: {self.cells}; validator results: {self.results}; "
            f"workload records: {self.records}"
        ]
        lines += [f"skipped {s}" for s in self.skipped]
        lines += [f"error: {e}" for e in self.errors]
        return "\n".join(lines)


def find_repo_root(start: Path | None = None) -> Path | None:
    """The workspace root above `start` (default: the working directory, then this package)."""
    candidates = [start or Path.cwd(), Path(__file__).resolve()]
    for base in candidates:
        for folder in (base, *base.parents):
            if (folder / "benchmarks").is_dir() and (folder / "validator").is_dir():
                return folder
    return None


def _objects(path: Path) -> list[Any]:
    # The ingest API's strict parser: NaN, Infinity and runaway nesting are errors here too.
    data = parse_json(path.read_bytes())
    return data if isinstance(data, list) else [data]


def _unreadable(where: str, exc: OSError | BodyError) -> str:
    """The report's line for a result file that cannot be read or is not strict JSON."""
    if isinstance(exc, BodyError):
        return f"{where}: not strict JSON ({exc.message})"
    return f"{where}: not readable ({exc})"


def _looks_like(obj: Any, mark: tuple[str, ...]) -> bool:
    return isinstance(obj, dict) and all(k in obj for k in mark)


def _first_error(exc: ValidationError) -> str:
    e = exc.errors(include_url=False)[0]
    return f"{'.'.join(str(x) for x in e['loc']) or 'body'}: {e['msg']}"


def _ingest_dir(
    db: Database,
    root: Path,
    folder: Path,
    schema: type[BaseModel],
    mark: tuple[str, ...],
    report: SeedReport,
) -> int:
    count = 0
    for path in sorted((root / folder).rglob("*.json")):
        if path.name.startswith("."):
            continue  # a producer's temporary file mid-write
        rel = path.relative_to(root).as_posix()
        try:
            objects = _objects(path)
        except (OSError, BodyError) as exc:
            report.errors.append(_unreadable(rel, exc))
            continue
        for i, obj in enumerate(objects):
            where = rel if len(objects) == 1 else f"{rel}[{i}]"
            if not _looks_like(obj, mark):
                report.skipped.append(f"{where} (no {' / '.join(mark)}: not a {schema.__name__})")
                continue
            try:
                item = schema.model_validate(obj)
            except ValidationError as exc:
                report.errors.append(f"{where}: {_first_error(exc)}")
                continue
            with db.write() as session:
                if isinstance(item, BenchmarkCell):
                    upsert_cell(session, item, source=where)
                else:
                    upsert_validator(session, item, source=where)  # type: ignore[arg-type]
            count += 1
    return count


def seed(db: Database, root: Path | None) -> SeedReport:
    """Migrate, refresh the registry, then ingest every committed result under `root`."""
    report = SeedReport()
    db.migrate()
    with db.write() as session:
        report.architectures = seed_registry(session)
    if root is None:
        report.skipped.append(
            "result JSON: no folder with benchmarks/ and validator/ found from the working "
            "directory; the throughput and validation pages stay empty until you run "
            "`ie dashboard seed --root PATH` on a clone of the repository (or on a folder where "
            "`ie bench` and `ie validate` wrote cells/ and results/)"
        )
        return report
    cells, results = _folder(root, BENCH_DIR), _folder(root, VALIDATOR_DIR)
    report.cells = _ingest_dir(db, root, cells, BenchmarkCell, BENCH_MARK, report)
    report.results = _ingest_dir(db, root, results, ValidatorResult, VALIDATOR_MARK, report)
    report.records = _ingest_records(db, root, report)
    return report


# Sections of one record sort together and records keep RECORDS' order on the page.
_SECTIONS_PER_RECORD = 100


def _ingest_records(db: Database, root: Path, report: SeedReport) -> int:
    """Each record file whole or not at all: a malformed one is an error naming its field and
    leaves what an earlier seed stored from it in place."""
    count = 0
    for index, spec in enumerate(RECORDS):
        path = root / spec.path
        if not path.is_file():
            continue  # an installed dashboard's folder holds cells and results, not these
        try:
            raw = path.read_bytes()
            sections = read_record(spec, parse_json(raw))
        except (OSError, BodyError) as exc:
            report.errors.append(_unreadable(spec.path, exc))
            continue
        except RecordError as exc:
            report.errors.append(f"{spec.path}: {exc}")
            continue
        with db.write() as session:
            replace_record(session, spec.path, sections, raw, index * _SECTIONS_PER_RECORD)
        count += 1
    return count


def _folder(root: Path, committed: Path) -> Path:
    """The committed folder in a clone; elsewhere its last part (`cells/`, `results/`), where
    `ie bench` and `ie validate` installed from wheels write in their working directory."""
    return committed if (root / committed).is_dir() else Path(committed.name)


def is_empty(db: Database) -> bool:
    """No results stored yet (the registry alone does not count)."""
    with db.read() as s:
        return (
            s.exec(select(BenchmarkCellRow.id)).first() is None
            and s.exec(select(ValidatorRunRow.id)).first() is None
        )
