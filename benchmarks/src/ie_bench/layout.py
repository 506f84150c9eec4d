"""Where `ie bench` reads and writes: a folder chosen by the user, never the installed package.

The folder is `--root`, else `$IE_BENCH_ROOT`, else the working directory. Inside a clone of
interp-engine (the folder or one of its parents) the committed layout is used: cells under
`benchmarks/cells/`, the report `benchmarks/results-latest.md`, the README's throughput block and
`benchmarks/throughput.json`. Anywhere else everything goes into the folder itself (`cells/`,
`results-latest.md`, `throughput.json`) and no README is touched unless one is named.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ROOT_ENV = "IE_BENCH_ROOT"
WORKSPACE_NAME = 'name = "interp-engine-workspace"'


@dataclass(frozen=True)
class Layout:
    root: Path
    clone: Path | None  # the interp-engine checkout holding `root`, if any
    cells_dir: Path
    results_md: Path
    readme: Path | None  # the file with THROUGHPUT markers to publish into; None: publish none
    throughput_json: Path
    log_dir: Path


def find_clone(start: Path) -> Path | None:
    """The interp-engine checkout that holds `start` (itself or a parent), or None."""
    for folder in (start, *start.parents):
        manifest = folder / "pyproject.toml"
        if (
            (folder / "benchmarks" / "pyproject.toml").is_file()
            and manifest.is_file()
            and WORKSPACE_NAME in manifest.read_text(errors="replace")
        ):
            return folder
    return None


def chosen_root(root: Path | None = None) -> Path:
    """`root`, else `$IE_BENCH_ROOT`, else the working directory (absolute)."""
    picked = root or (Path(os.environ[ROOT_ENV]) if os.environ.get(ROOT_ENV) else Path.cwd())
    return picked.expanduser().resolve()


def layout(root: Path | None = None) -> Layout:
    base = chosen_root(root)
    clone = find_clone(base)
    if clone is not None:
        bench = clone / "benchmarks"
        return Layout(
            root=base,
            clone=clone,
            cells_dir=bench / "cells",
            results_md=bench / "results-latest.md",
            readme=clone / "README.md",
            throughput_json=bench / "throughput.json",
            log_dir=bench / ".logs",
        )
    return Layout(
        root=base,
        clone=None,
        cells_dir=base / "cells",
        results_md=base / "results-latest.md",
        readme=None,
        throughput_json=base / "throughput.json",
        log_dir=base / ".logs",
    )
