"""The graph page in Debian's Chromium at a laptop's 1280 px and a phone's 400 px (issue 68,
item 8): the drawing uses the width (it was 530 px at 1280), nodes at one layer and position do
not sit on one another (they piled into a bar), logits are labelled as logits after the last
layer (the JSON's layer 31 on a 30-layer model showed as "Layer 31"), and features carry the
set's recorded kind (circuit-tracer types every one "cross layer transcoder").

The graph is shaped like `ie trace`'s on SmolLM2 (30 layers, six positions, logits at layer 31),
with 24 features in one cell as its last position's layer 29 has.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
from browser_install import ensure_chromium
from ie_dashboard.app import create_app
from ie_dashboard.config import database_url
from ie_dashboard.db import Database
from ie_dashboard.ingest import upsert_graph
from ie_dashboard.screenshots import CHROMIUM, CHROMIUM_ARGS
from ie_dashboard.serve import background_server

BROWSER_MISSING = ensure_chromium()
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(BROWSER_MISSING is not None, reason=str(BROWSER_MISSING)),
]
TOKENS = ["<|im_start|>", "The", " capital", " of", " France", " is"]
RADIUS = 5


def smollm2_shaped() -> dict[str, Any]:
    def node(nid: str, layer: str, pos: int, kind: str, **extra: Any) -> dict[str, Any]:
        return {"node_id": nid, "layer": layer, "ctx_idx": pos, "feature_type": kind,
                "token_prob": 0.0, "clerp": "", **extra}  # fmt: skip

    nodes = [node(f"E_{i}_{p}", "E", p, "embedding") for p, i in enumerate(range(6))]
    pile = [node(f"29_{f}_5", "29", 5, "cross layer transcoder", feature=f,
                 influence=0.01 * f, activation=1.0) for f in range(24)]  # fmt: skip
    spread = [node(f"{layer}_7_{p}", str(layer), p, "cross layer transcoder", feature=7,
                   influence=0.5, activation=0.5) for layer in (0, 11) for p in (2, 4)]  # fmt: skip
    errors = [node("0_3_5", "3", 5, "mlp reconstruction error", influence=0.3)]
    logits = [node("31_6342_5", "31", 5, "logit", feature=6342, token_prob=0.77,
                   clerp='Output " Paris" (p=0.770)')]  # fmt: skip
    nodes += pile + spread + errors + logits
    links = [{"source": n["node_id"], "target": "31_6342_5", "weight": 0.1 + 0.01 * i}
             for i, n in enumerate(pile + spread + errors)]  # fmt: skip
    meta = {"slug": "smollm2-capital", "scan": "smollm2", "prompt": "The capital of France is",
            "prompt_tokens": TOKENS, "node_threshold": 0.5,
            "transcoder_kind": "per-layer transcoder"}  # fmt: skip
    return {"metadata": meta, "nodes": nodes, "links": links}


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    db = Database(database_url(tmp_path_factory.mktemp("graph_page") / "d.sqlite"))
    db.migrate()
    with db.write() as session:
        upsert_graph(session, smollm2_shaped(), source="test")
    with background_server(create_app(db, token=None)) as url:
        yield url
    db.dispose()


@pytest.fixture(scope="module")
def browser():  # type: ignore[no-untyped-def]
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def _centres(page) -> dict[tuple[str, str], list[tuple[float, float]]]:  # type: ignore[no-untyped-def]
    """Each circle's centre on screen, by (layer, position)."""
    found = page.evaluate(
        "Array.from(document.querySelectorAll('svg.graph circle.node')).map(c => {"
        " const b = c.getBoundingClientRect();"
        " return [c.dataset.layer, c.dataset.pos, b.x + b.width / 2, b.y + b.height / 2]; })"
    )
    cells: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for layer, pos, x, y in found:
        cells.setdefault((layer, pos), []).append((x, y))
    return cells


@pytest.mark.parametrize("width", [1280, 400])
def test_the_graph_page_at_a_laptop_and_a_phone(base_url: str, browser, width: int) -> None:  # type: ignore[no-untyped-def]
    page = browser.new_page(viewport={"width": width, "height": 900})
    try:
        page.goto(f"{base_url}/graphs/1", wait_until="networkidle")
        svg = page.locator("svg.graph").bounding_box()
        main = page.evaluate(
            "(() => { const m = getComputedStyle(document.querySelector('main'));"
            " return document.querySelector('main').clientWidth - parseFloat(m.paddingLeft)"
            " - parseFloat(m.paddingRight); })()"
        )
        assert svg is not None
        if width == 1280:
            assert svg["width"] >= 0.9 * main and svg["width"] <= main + 1, (svg, main)
        else:  # the drawing keeps its size and scrolls in its frame; the page does not
            assert page.evaluate("document.documentElement.scrollWidth") <= width
            assert page.evaluate(
                "(() => { const w = document.querySelector('.graphwrap');"
                " return w.scrollWidth > w.clientWidth && w.clientWidth <= window.innerWidth; })()"
            )
        cells = _centres(page)
        assert len(cells[("29", "5")]) == 24
        for key, centres in cells.items():
            for i, (x1, y1) in enumerate(centres):
                for x2, y2 in centres[i + 1 :]:
                    gap = math.dist((x1, y1), (x2, y2))
                    assert gap >= 2 * RADIUS, (key, (x1, y1), (x2, y2))
        labels = page.locator("svg.graph text.rowlabel").all_text_contents()
        assert labels[-1] == "logits" and "L31" not in labels and "L29" in labels, labels

        page.locator('svg.graph circle[data-node="31_6342_5"]').click(force=True)
        page.locator('#node-detail .nodedetail[data-node="31_6342_5"]').wait_for(timeout=10_000)
        detail = page.inner_text("#node-detail")
        assert "Logits, after the last layer (29" in detail and "Layer 31" not in detail, detail
        page.locator('svg.graph circle[data-node="29_3_5"]').click(force=True)
        page.locator('#node-detail .nodedetail[data-node="29_3_5"]').wait_for(timeout=10_000)
        detail = page.inner_text("#node-detail")
        assert "per-layer transcoder feature" in detail and "cross layer" not in detail, detail
    finally:
        page.close()
