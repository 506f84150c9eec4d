"""The atlas pages in Debian's Chromium at 400 and 1560 px (the widths docs/img shows): no page
scrolls sideways, the search swaps the index's rows in place (htmx) and deep-links them, a
feature page draws its histogram and shades its tokens, a graph node's link opens its feature,
and `take_screenshots` writes the atlas pages' PNGs at both widths."""

from __future__ import annotations

import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from atlas_fixtures import synthetic_atlas
from browser_install import ensure_chromium
from ie_dashboard.app import create_app
from ie_dashboard.atlas_import import import_atlas
from ie_dashboard.config import database_url
from ie_dashboard.db import Database
from ie_dashboard.ingest import upsert_graph
from ie_dashboard.screenshots import CHROMIUM, CHROMIUM_ARGS
from ie_dashboard.serve import background_server
from test_dashboard_atlas import decode, linked_graph

BROWSER_MISSING = ensure_chromium()
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(BROWSER_MISSING is not None, reason=str(BROWSER_MISSING)),
]
WIDTH = 2048  # features: the import stays quick; the 16k case is test_dashboard_atlas.py's


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp("atlas_browser")
    data = synthetic_atlas(tmp / "atlas", d_sae=WIDTH)
    db = Database(database_url(tmp / "d.sqlite"))
    db.migrate()
    with db.write() as session:
        atlas_id, _ = import_atlas(session, data.folder, decode)
        graph_id, _ = upsert_graph(session, linked_graph(), source="test")
    with background_server(create_app(db, token=None)) as url:
        yield {"url": url, "atlas": atlas_id, "graph": graph_id, "db": db, "tmp": tmp}
    db.dispose()


@pytest.fixture(scope="module")
def browser():  # type: ignore[no-untyped-def]
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.mark.parametrize("width", [400, 1560])
def test_no_atlas_page_scrolls_sideways(served: dict[str, Any], browser, width: int) -> None:  # type: ignore[no-untyped-def]
    page = browser.new_page(viewport={"width": width, "height": 900})
    a = served["atlas"]
    paths = ["/atlases", f"/atlases/{a}", f"/atlases/{a}?sort=density&page=3",
             f"/atlases/{a}/features/7", f"/graphs/{served['graph']}?node=5_4_2", "/throughput"]  # fmt: skip
    try:
        wide = {}
        for path in paths:
            page.goto(served["url"] + path, wait_until="networkidle")
            extra = int(page.evaluate("document.documentElement.scrollWidth - window.innerWidth"))
            if extra > 0:
                wide[path] = extra
        assert wide == {}, f"pages wider than {width} px: {wide}"
    finally:
        page.close()


def test_search_swaps_the_rows_in_place(served: dict[str, Any], browser) -> None:  # type: ignore[no-untyped-def]
    page = browser.new_page(viewport={"width": 1560, "height": 900})
    try:
        page.goto(f"{served['url']}/atlases/{served['atlas']}", wait_until="networkidle")
        assert page.locator("table.atlasindex tbody tr").count() == 50
        page.evaluate("window.__stayed = true")
        page.fill("input[name=q]", "1234")
        page.click("form.atlassearch button")
        page.wait_for_function("document.querySelectorAll('table.atlasindex tbody tr').length == 1")
        assert page.locator("table.atlasindex tbody tr a").inner_text() == "1234"
        assert page.evaluate("window.__stayed === true"), "the search reloaded the page"
        assert "q=1234" in page.url  # the search is a deep link
        page.select_option("select[name=sort]", "max")
        page.fill("input[name=q]", "")
        page.click("form.atlassearch button")
        page.wait_for_function(
            "document.querySelectorAll('table.atlasindex tbody tr').length == 50"
        )
        values = [
            float(v)
            for v in page.locator("table.atlasindex tbody tr td:nth-child(4)").all_inner_texts()
        ]
        assert values == sorted(values, reverse=True)
    finally:
        page.close()


def test_feature_page_draws_and_a_graph_node_links_to_it(served: dict[str, Any], browser) -> None:  # type: ignore[no-untyped-def]
    page = browser.new_page(viewport={"width": 1560, "height": 900})
    try:
        page.goto(f"{served['url']}/graphs/{served['graph']}", wait_until="networkidle")
        page.click('svg.graph circle[data-node="5_4_2"]')
        page.locator("#node-detail a.featurelink").click()
        page.wait_for_url(f"**/atlases/{served['atlas']}/features/4")
        box = page.locator("svg.hist").bounding_box()
        assert box is not None and box["width"] > 200 and box["height"] > 40
        assert page.locator("svg.hist rect.hbar").count() > 0
        peak = page.locator(".ctx .t.peak").first
        assert peak.evaluate("e => getComputedStyle(e).backgroundColor") == "rgb(255, 140, 0)"
        assert "Feature 4" in page.locator("h1").inner_text()
    finally:
        page.close()


def _png_width(path: Path) -> int:
    with path.open("rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">I", head[16:20])[0]


def test_screenshots_include_the_atlas_pages(served: dict[str, Any]) -> None:
    """`ie dashboard screenshots --db` (its own process: Playwright's sync API runs one loop per
    process, and this module's browser holds it)."""
    out = served["tmp"] / "shots"
    db = served["tmp"] / "d.sqlite"
    code = (
        "import sys; from ie_dashboard.cli import dashboard_command as c; sys.exit(c(sys.argv[1:]))"
    )
    args = ["screenshots", "--db", str(db), "--out", str(out), "--widths", "400"]
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for name, width in (("atlas.png", 1560), ("feature.png", 1560), ("atlas-400.png", 400),
                        ("feature-400.png", 400)):  # fmt: skip
        assert _png_width(out / name) == width, name
