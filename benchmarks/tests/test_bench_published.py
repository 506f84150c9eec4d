"""The README's throughput block and benchmarks/throughput.json equal a fresh render of the committed
cells: a number edited by hand, or cells re-measured without publishing, fails here."""

from __future__ import annotations

from pathlib import Path

import pytest
from ie_bench.cells import load_cells
from ie_bench.layout import layout
from ie_bench.publish import END, START, drift

# The committed cells of this checkout, found from the test's own location.
CHECKOUT = layout(Path(__file__).resolve().parents[2])
CELLS_DIR, THROUGHPUT_JSON = CHECKOUT.cells_dir, CHECKOUT.throughput_json
README = CHECKOUT.readme or Path("README.md")


def test_committed_cells_are_valid() -> None:
    # read_cell validates each file against the schema and raises naming the field.
    load_cells(CELLS_DIR)


def test_readme_and_json_match_committed_cells() -> None:
    cells = load_cells(CELLS_DIR)
    if not cells:
        pytest.skip(f"no committed cells under {CELLS_DIR}")
    text = README.read_text()
    assert START in text and END in text, f"{README} lost its THROUGHPUT markers"
    assert drift(cells, README, THROUGHPUT_JSON) == []
