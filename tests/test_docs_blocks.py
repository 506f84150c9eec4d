"""Every ```python block in README.md and docs/*.md runs as written.

The blocks of one file run in order in one namespace, as a reader pasting them into one session
would. A block that needs something CI lacks (a vLLM engine, a GPU) is marked by the line
`<!-- docs-test: skip (REASON) -->` right above its fence and is reported as skipped. docs/notes/
holds signature listings, not runnable examples, and is not collected.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```python\s*$")
SKIP = re.compile(r"^<!--\s*docs-test:\s*skip\b(?P<why>.*?)-->\s*$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the first code line
    code: str
    skip: str | None  # the marker's reason, or None


def blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        if not FENCE.match(lines[i]):
            i += 1
            continue
        above = next((t for t in reversed(lines[:i]) if t.strip()), "")
        marker = SKIP.match(above.strip())
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        code = "\n".join(lines[i + 1 : end]) + "\n"
        found.append(
            Block(path, i + 2, code, marker.group("why").strip() or "marked" if marker else None)
        )
        i = end + 1
    return found


def test_the_collector_sees_the_blocks() -> None:
    """A guard against the test passing because it found nothing to run."""
    assert len(blocks(ROOT / "README.md")) >= 1
    assert len(blocks(ROOT / "docs" / "USAGE.md")) >= 5


@pytest.mark.parametrize(
    "path", [p for p in DOCS if blocks(p)], ids=lambda p: p.relative_to(ROOT).as_posix()
)
def test_python_blocks_run_as_written(path: Path) -> None:
    namespace: dict[str, object] = {"__name__": "__docs__"}
    skipped: list[str] = []
    for block in blocks(path):
        where = f"{path.relative_to(ROOT)}:{block.line}"
        if block.skip is not None:
            skipped.append(f"{where} ({block.skip})")
            continue
        exec(compile(block.code, where, "exec"), namespace)
    if skipped:
        pytest.skip("ran every other block; skipped " + ", ".join(skipped))
