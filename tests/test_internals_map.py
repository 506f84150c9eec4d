"""Every file docs/INTERNALS.md's map names exists, so the map cannot drift from the tree."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INTERNALS = ROOT / "docs" / "INTERNALS.md"


def map_paths(text: str) -> list[str]:
    section = text.split("## Map", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"`((?:packages|apps|benchmarks|validator)/[^`]+\.py)`", section)


def test_every_path_in_the_map_exists() -> None:
    paths = map_paths(INTERNALS.read_text())
    assert len(paths) >= 15, "the map lost its rows"
    missing = [p for p in paths if not (ROOT / p).is_file()]
    assert missing == [], f"docs/INTERNALS.md names files that do not exist: {missing}"


def test_the_check_catches_a_missing_file() -> None:
    # Negative control: a map row naming a file that is not there is reported.
    text = "## Map\n| x | `packages/ie-core/src/ie_core/no_such_module.py` |\n## Next\n"
    paths = map_paths(text)
    assert paths == ["packages/ie-core/src/ie_core/no_such_module.py"]
    assert not (ROOT / paths[0]).is_file()
