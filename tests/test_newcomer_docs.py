"""Docs a newcomer reads first agree with the repository: the mkdocs nav lists every page, and
the README's uv override pins the torchvision the lock installs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_docs_page_is_in_the_mkdocs_nav() -> None:
    nav = re.findall(r":\s*([A-Z_]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert len(pages) >= 7 and [p for p in pages if p not in nav] == []


def test_readme_override_pins_the_locked_torchvision() -> None:
    lock = (ROOT / "uv.lock").read_text()
    locked = re.search(r'name = "torchvision"\nversion = "([^"]+)"', lock)
    pinned = re.search(
        r"printf 'torch==[^\\]+\\ntorchvision==([0-9.]+)", (ROOT / "README.md").read_text()
    )
    assert locked and pinned, "the lock or the README's override line moved"
    assert pinned.group(1) == locked.group(1)
