"""The errors a harvest raises: each says what went wrong, why, and what to do."""

from __future__ import annotations

from ie_core.errors import InterpError


class HarvestError(InterpError):
    """Base of every harvest error."""


class CorpusError(HarvestError, ValueError):
    """A data file that cannot be read as a corpus (missing, empty, wrong column, bad line)."""


class HarvestMismatchError(HarvestError, ValueError):
    """The output folder holds a harvest made by a different command; `differences` names them."""

    def __init__(self, message: str, differences: dict[str, tuple[object, object]]) -> None:
        super().__init__(message)
        self.differences = differences


class OutputFolderError(HarvestError, OSError):
    """The output folder cannot be written, or the disk lacks room for the next shard."""


class MissingExtraError(HarvestError, ImportError):
    """An optional dependency (pyarrow for parquet, torch / safetensors for shards) is absent."""
