"""The workload cards in Debian's Chromium at a phone's 400 px and a laptop's 1400 px: every
record's card is drawn (bars with width, not just markup), the page never scrolls sideways, and
the list at the top jumps to a card. Seeded from this repository's committed records."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from browser_install import ensure_chromium
from ie_dashboard.app import create_app
from ie_dashboard.config import database_url
from ie_dashboard.db import Database
from ie_dashboard.records import RECORDS
from ie_dashboard.screenshots import CHROMIUM, CHROMIUM_ARGS
from ie_dashboard.seed import seed
from ie_dashboard.serve import background_server
from test_dashboard_workloads import _copy_records

BROWSER_MISSING = ensure_chromium()

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(BROWSER_MISSING is not None, reason=str(BROWSER_MISSING)),
]


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = _copy_records(tmp_path_factory.mktemp("records"))
    db = Database(database_url(root / "browser.sqlite"))
    assert seed(db, root).errors == []
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


@pytest.mark.parametrize("width", [400, 1400])
def test_every_workload_card_is_drawn(base_url: str, browser, width: int) -> None:  # type: ignore[no-untyped-def]
    page = browser.new_page(viewport={"width": width, "height": 900})
    try:
        page.goto(f"{base_url}/throughput", wait_until="networkidle")
        assert page.evaluate("document.documentElement.scrollWidth - window.innerWidth") <= 0
        # The generation cards still come first.
        assert page.locator("section.model:not(.workload) table.tput tbody tr").count() == 5
        cards = page.locator("section.workload")
        sources = {
            c.split("record ", 1)[1].split(" ·")[0]
            for c in cards.locator("p.prov").all_inner_texts()
        }
        assert {s.path for s in RECORDS} <= sources
        for i in range(cards.count()):
            card = cards.nth(i)
            card.scroll_into_view_if_needed()
            bars = card.locator("svg.wchart rect.wbar")
            widths = [
                b["width"] for b in (bars.nth(j).bounding_box() for j in range(bars.count())) if b
            ]
            assert widths and max(widths) > 50, card.get_attribute("data-workload")
            box = card.bounding_box()
            assert box is not None and box["x"] + box["width"] <= width + 1  # the card fits
    finally:
        page.close()


def test_the_list_jumps_to_a_card(base_url: str, browser) -> None:  # type: ignore[no-untyped-def]
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    try:
        page.goto(f"{base_url}/throughput", wait_until="networkidle")
        page.click("ul.toc >> text=Patch sweep")
        page.wait_for_url("**#wl-patch-sweep")
        top = page.locator("#wl-patch-sweep").bounding_box()
        assert top is not None and abs(top["y"]) < 100  # scrolled to it
    finally:
        page.close()
