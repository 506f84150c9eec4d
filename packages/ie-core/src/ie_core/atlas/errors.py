"""The errors an atlas raises: each says what went wrong, why, and what to do."""

from __future__ import annotations

from ie_core.harvest.errors import HarvestError


class AtlasError(HarvestError):
    """Base of every atlas error (a harvest error: corpus and folder refusals are shared)."""


class AtlasMismatchError(AtlasError, ValueError):
    """The output folder holds an atlas made by a different command; `differences` names them."""

    def __init__(self, message: str, differences: dict[str, tuple[object, object]]) -> None:
        super().__init__(message)
        self.differences = differences


__all__ = ["AtlasError", "AtlasMismatchError"]
