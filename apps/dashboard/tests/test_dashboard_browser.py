"""A real headless Chromium (Debian's `chromium`, driven by Playwright) against the live app.

`browser_install.ensure_chromium` installs the browser with apt-get when it is missing and the
tests run as root (as in CI and a fresh container); Playwright's own browser download is never
used. Elsewhere the tests are skipped, saying what to install.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from browser_install import ensure_chromium
from dashboard_fixtures import make_cell, make_graph, make_result, write_json
from ie_dashboard.app import create_app
from ie_dashboard.config import database_url
from ie_dashboard.db import Database
from ie_dashboard.ingest import upsert_graph
from ie_dashboard.screenshots import CHROMIUM, CHROMIUM_ARGS
from ie_dashboard.seed import seed
from ie_dashboard.serve import background_server

BROWSER_MISSING = ensure_chromium()

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(BROWSER_MISSING is not None, reason=str(BROWSER_MISSING)),
]


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("repo")
    for variant, one, conc in (("eager", 20.0, 18.0), ("vllm", 30.0, 140.0)):
        write_json(
            root / f"benchmarks/cells/cpu/smollm2__{variant}.json",
            make_cell(variant=variant, decode=one, aggregate=conc),
        )
    write_json(root / "validator/results/ie-synthetic__llama/nnsight.json", make_result())
    db = Database(database_url(root / "browser.sqlite"))
    assert seed(db, root).errors == []
    with db.write() as session:
        upsert_graph(session, make_graph(), source="test")
    with background_server(create_app(db, token=None)) as url:
        yield url
    db.dispose()


@pytest.fixture(scope="module")
def page(base_url: str):  # type: ignore[no-untyped-def]
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1500, "height": 1000})
        yield page
        browser.close()


def test_click_a_point_swaps_in_its_card(base_url: str, page) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{base_url}/?arch=llama", wait_until="networkidle")
    assert page.locator("#card .card").count() == 0
    # A marker on window survives an htmx swap but not a full page load.
    page.evaluate("window.__stayed = true")
    page.click("#pt-resid_post")
    card = page.locator("#card .card[data-point='resid_post']")
    card.wait_for(state="visible", timeout=10_000)
    assert "blocks.{L}.hook_resid_post" in card.inner_text()
    assert page.evaluate("window.__stayed === true"), (
        "the click reloaded the page instead of swapping the card"
    )
    assert page.url.endswith("/?arch=llama&point=resid_post")  # hx-push-url makes it a deep link
    assert "selected" in (page.get_attribute("#pt-resid_post", "class") or "")
    # Another point replaces the card; an absent one explains itself.
    page.click("#pt-q_norm_in")
    page.locator("#card .card[data-point='q_norm_in']").wait_for(timeout=10_000)
    assert "Llama has no qk norm" in page.inner_text("#card")
    assert page.locator("#card .card").count() == 1


def test_throughput_page_shows_table_and_chart(base_url: str, page) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{base_url}/?arch=gpt2", wait_until="networkidle")
    page.click("header nav >> text=Throughput")
    page.wait_for_url(f"{base_url}/throughput")
    assert page.locator("table.tput tbody tr").count() == 2
    assert "7.8x" in page.inner_text("table.tput")
    assert page.locator("svg.chart rect.bar").count() == 4
    box = page.locator("svg.chart rect.bar.conc").nth(1).bounding_box()
    assert box is not None and box["width"] > 100  # drawn, not just present in the markup


def test_validation_drill_down(base_url: str, page) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{base_url}/validation", wait_until="networkidle")
    page.click("table.matrix td.g a")
    page.locator("#run .run").wait_for(timeout=10_000)
    assert "resid_post.3" in page.inner_text("#run")


def test_graph_page_draws_and_a_click_shows_a_node(base_url: str, page) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{base_url}/graphs", wait_until="networkidle")
    page.click("table.graphs a")
    page.locator("svg.graph").wait_for(timeout=10_000)
    assert page.locator("svg.graph circle.node").count() == 8
    assert page.locator("svg.graph line.edge").count() == 6
    box = page.locator("svg.graph").bounding_box()
    assert box is not None and box["width"] > 100 and box["height"] > 100  # drawn, not just markup
    page.click('svg.graph circle[data-node="1_4_2"]')
    page.locator("#node-detail .nodedetail").wait_for(timeout=10_000)
    detail = page.inner_text("#node-detail")
    assert "activation 2.25" in detail and "0_3_1" in detail and "3_42_2" in detail
    assert page.url.endswith("node=1_4_2")  # the click's deep link
