"""The API reference (mkdocs + mkdocstrings) builds with --strict, and lists ie_core's public names.

mkdocs runs in its own tool environment through `uvx` with pinned versions, so the workspace lock
does not carry it; mkdocstrings reads the sources statically (griffe), importing nothing.
About 10 s with uv's cache warm.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import ie_core

ROOT = Path(__file__).resolve().parents[1]
MKDOCS = ["uvx", "--from", "mkdocs==1.6.1", "--with", "mkdocstrings-python==2.0.11", "mkdocs"]


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    assert shutil.which("uvx"), "uvx (part of uv) must be on PATH"
    site = tmp_path / "site"
    done = subprocess.run(
        [*MKDOCS, "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    page = (site / "api" / "ie_core" / "index.html").read_text()
    missing = [name for name in ie_core.__all__ if name not in page]
    assert missing == [], missing
