"""Corpus readers: text, JSON-lines and parquet files, or any iterable of strings, as documents.

A `.txt` file holds one document per paragraph (lines up to a blank line); a `.jsonl` / `.json` file one JSON object per
line with the document under `column`; a `.parquet` file a string column `column` (needs pyarrow).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ie_core.harvest.errors import CorpusError, MissingExtraError

__all__ = ["DataFile", "checked_documents", "describe_files", "iter_file_documents"]

TEXT_SUFFIXES = (".txt", ".text")
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet",)


@dataclass(frozen=True)
class DataFile:
    """A data file as the manifest records it: path, size and content hash."""

    path: str
    bytes: int
    sha256: str


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _check_file(path: Path) -> None:
    if not path.is_file():
        raise CorpusError(
            f"data file {str(path)!r} does not exist or is not a file; pass existing files"
        )
    if path.suffix.lower() not in TEXT_SUFFIXES + JSONL_SUFFIXES + PARQUET_SUFFIXES:
        raise CorpusError(
            f"data file {str(path)!r} has suffix {path.suffix!r}; harvest reads .txt (a document "
            "per paragraph), .jsonl (an object per line) and .parquet files"
        )


def describe_files(paths: Sequence[str | Path]) -> tuple[DataFile, ...]:
    """Check every file exists with a known suffix and hash it, before any model work starts."""
    if not paths:
        raise CorpusError("no data files given; pass at least one --data FILE")
    files = []
    for raw in paths:
        path = Path(raw)
        _check_file(path)
        files.append(DataFile(str(path.resolve()), path.stat().st_size, _sha256(path)))
    return tuple(files)


def _text_documents(path: Path) -> Iterator[str]:
    """Paragraphs: blocks of lines between blank lines, inner newlines kept."""
    lines: list[str] = []
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                lines.append(line.rstrip("\n"))
            elif lines:
                yield "\n".join(lines)
                lines = []
    if lines:
        yield "\n".join(lines)


def _jsonl_documents(path: Path, column: str) -> Iterator[str]:
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CorpusError(f"{path}:{number}: not a JSON object ({exc.msg})") from None
            if not isinstance(record, dict) or not isinstance(record.get(column), str):
                keys = sorted(record) if isinstance(record, dict) else type(record).__name__
                raise CorpusError(
                    f"{path}:{number}: no string field {column!r} (found {keys}); "
                    "name the field with --column"
                )
            yield record[column]


def _parquet_documents(path: Path, column: str) -> Iterator[str]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise MissingExtraError(
            f"reading {path} needs pyarrow, which is not installed; run "
            "pip install 'ie-core[parquet]' (or convert the file to .jsonl)"
        ) from None
    table = pq.ParquetFile(path)
    if column not in table.schema_arrow.names:
        raise CorpusError(
            f"{path}: no column {column!r} (columns: {table.schema_arrow.names}); "
            "name the column with --column"
        )
    for batch in table.iter_batches(columns=[column]):
        for value in batch.column(0).to_pylist():
            if not isinstance(value, str):
                raise CorpusError(
                    f"{path}: column {column!r} holds {type(value).__name__}, not text"
                )
            yield value


def _file_documents(path: Path, column: str) -> Iterator[str]:
    suffix = path.suffix.lower()
    if suffix in TEXT_SUFFIXES:
        return _text_documents(path)
    if suffix in JSONL_SUFFIXES:
        return _jsonl_documents(path, column)
    return _parquet_documents(path, column)


def iter_file_documents(paths: Sequence[str | Path], column: str = "text") -> Iterator[str]:
    """The files' documents in order (each file checked before it is read)."""
    for raw in paths:
        path = Path(raw)
        _check_file(path)
        yield from _file_documents(path, column)


def checked_documents(documents: Iterable[str]) -> Iterator[str]:
    """An iterable of documents from Python, each checked to be a string."""
    if isinstance(documents, (str, bytes)):
        raise CorpusError("documents must be an iterable of strings, not one string")
    for item in documents:
        if not isinstance(item, str):
            raise CorpusError(f"documents must be strings, got {type(item).__name__}")
        yield item
