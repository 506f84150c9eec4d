"""Where `ie validate` reads and writes: a folder chosen by the user, never the installed package.

The folder is `--root`, else `$IE_VALIDATOR_ROOT`, else the working directory. Inside a clone of
interp-engine (the folder or one of its parents) the committed layout is used: results under
`validator/results/`, the matrix in `validator/README.md`, pages in `validator/models/`, the
mappings doc in `docs/`, the nnterp environment in `validator/.venv-nnterp`. Anywhere else:
`results/`, `validation.md` and `models/` in the folder, the mappings doc printed or written where
named, and the nnterp environment in the user cache (`$IE_CACHE_DIR`, else
`~/.cache/interp-engine`); `$IE_NNTERP_ENV` overrides that path everywhere.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ROOT_ENV", "Layout", "find_clone", "layout"]

ROOT_ENV = "IE_VALIDATOR_ROOT"
NNTERP_ENV = "IE_NNTERP_ENV"
WORKSPACE_NAME = 'name = "interp-engine-workspace"'


@dataclass(frozen=True)
class Layout:
    root: Path
    clone: Path | None  # the interp-engine checkout holding `root`, if any
    results: Path
    matrix_md: Path  # the file whose marked block holds the matrix
    pages_dir: Path  # one markdown page per model (the matrix links `models/<slug>.md`)
    mappings_doc: Path | None  # docs/ENGINE_HOOK_MAPPINGS.md in a clone; None elsewhere
    nnterp_env: Path


def find_clone(start: Path) -> Path | None:
    """The interp-engine checkout that holds `start` (itself or a parent), or None."""
    for folder in (start, *start.parents):
        manifest = folder / "pyproject.toml"
        if (
            (folder / "validator" / "pyproject.toml").is_file()
            and manifest.is_file()
            and WORKSPACE_NAME in manifest.read_text(errors="replace")
        ):
            return folder
    return None


def _cache_dir() -> Path:
    return Path(os.environ.get("IE_CACHE_DIR") or Path.home() / ".cache" / "interp-engine")


def layout(root: Path | None = None) -> Layout:
    picked = root or (Path(os.environ[ROOT_ENV]) if os.environ.get(ROOT_ENV) else Path.cwd())
    base = picked.expanduser().resolve()
    clone = find_clone(base)
    python = f"py{sys.version_info.major}{sys.version_info.minor}"
    if clone is not None:
        folder = clone / "validator"
        results, matrix, pages = folder / "results", folder / "README.md", folder / "models"
        mappings: Path | None = clone / "docs" / "ENGINE_HOOK_MAPPINGS.md"
        env = folder / ".venv-nnterp"
    else:
        results, matrix, pages = base / "results", base / "validation.md", base / "models"
        mappings = None
        env = _cache_dir() / f"nnterp-env-{python}"
    if os.environ.get(NNTERP_ENV):
        env = Path(os.environ[NNTERP_ENV])
    return Layout(base, clone, results, matrix, pages, mappings, env)
