"""The dashboard at a phone's 400 px and a laptop's 1400 px, in Debian's Chromium: no page
scrolls sideways, and at 1400 px the block diagram shows final_norm and lm_head unscrolled.
Seeded from this repository's committed results (every peer column, every results folder)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_install import ensure_chromium
from dashboard_fixtures import make_graph
from ie_dashboard.app import create_app
from ie_dashboard.config import database_url
from ie_dashboard.db import Database
from ie_dashboard.ingest import upsert_graph
from ie_dashboard.screenshots import CHROMIUM, CHROMIUM_ARGS
from ie_dashboard.seed import seed
from ie_dashboard.serve import background_server

ROOT = Path(__file__).resolve().parents[3]
BROWSER_MISSING = ensure_chromium()
PAGES = (
    "/?arch=llama&point=resid_post.9",
    "/?arch=deepseek-v4",
    "/compare?a=llama&b=gemma2",
    "/throughput",
    "/validation",
    "/graphs",
    "/graphs/1",
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(BROWSER_MISSING is not None, reason=str(BROWSER_MISSING)),
]


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    db = Database(database_url(tmp_path_factory.mktemp("widths") / "d.sqlite"))
    seed(db, ROOT)
    with db.write() as session:
        upsert_graph(session, make_graph(), source="test")
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


def _overflow(page) -> int:  # type: ignore[no-untyped-def]
    """How many pixels the page is wider than the window (0: no sideways scroll)."""
    return int(page.evaluate("document.documentElement.scrollWidth - window.innerWidth"))


@pytest.mark.parametrize("width", [400, 1400])
def test_no_page_scrolls_sideways(base_url: str, browser, width: int) -> None:  # type: ignore[no-untyped-def]
    page = browser.new_page(viewport={"width": width, "height": 900})
    try:
        wide = {}
        for path in PAGES:
            page.goto(base_url + path, wait_until="networkidle")
            if (extra := _overflow(page)) > 0:
                wide[path] = extra
        assert wide == {}, f"pages wider than {width} px: {wide}"
    finally:
        page.close()


def test_the_diagram_reaches_lm_head_at_1400(base_url: str, browser) -> None:  # type: ignore[no-untyped-def]
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    try:
        page.goto(f"{base_url}/?arch=llama", wait_until="networkidle")
        wrap = page.locator(".diagramwrap").bounding_box()
        assert wrap is not None
        for point in ("final_norm", "lm_head"):
            box = page.locator(f"#pt-{point}").bounding_box()
            assert box is not None and box["x"] + box["width"] <= wrap["x"] + wrap["width"], point
        assert page.evaluate(
            "(() => { const w = document.querySelector('.diagramwrap');"
            " return w.scrollWidth <= w.clientWidth; })()"
        )
    finally:
        page.close()


def test_the_validation_footer_is_one_short_sentence(base_url: str, browser) -> None:  # type: ignore[no-untyped-def]
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    try:
        page.goto(f"{base_url}/validation", wait_until="networkidle")
        footer = page.locator("footer").inner_text()
        assert "folders under validator/results/" in footer and len(footer) < 200, footer
    finally:
        page.close()
