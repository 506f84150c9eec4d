"""`ie dashboard screenshots`: PNGs of the three pages (and, where the database holds an atlas,
its index and a feature's page), taken in headless Chromium via Playwright."""

from __future__ import annotations

import shutil
from pathlib import Path

from ie_core.errors import UnsupportedOperationError
from sqlmodel import col, select

from ie_dashboard.app import create_app
from ie_dashboard.db import Database
from ie_dashboard.serve import background_server
from ie_dashboard.tables import AtlasFeatureRow, AtlasRow

CHROMIUM = "/usr/bin/chromium"
# No sandbox (root in containers), no GPU, and nothing that phones home: pages are localhost only.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str:
    """Debian's chromium (Playwright's own browser download is not used)."""
    path = shutil.which("chromium") or (CHROMIUM if Path(CHROMIUM).exists() else None)
    if path is None:
        raise UnsupportedOperationError(
            "screenshots need Debian's chromium, which is not found; install it with "
            "`apt-get install -y chromium`"
        )
    return path


def take_screenshots(
    db: Database,
    out: Path,
    arch: str = "llama",
    point: str = "resid_post.9",
    widths: tuple[int, ...] = (),
) -> list[Path]:
    """The three pages at 1560 px (`cheatsheet.png`, ...); with `widths`, also each page at each
    width (`cheatsheet-400.png`, ...), the narrow and laptop views docs/img shows."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise UnsupportedOperationError(
            "screenshots need Playwright's Python package, which is not installed: "
            "`pip install 'ie-dashboard[screenshots]'` (no browser download), and Debian's "
            "chromium (`apt-get install -y chromium`)"
        ) from None

    out.mkdir(parents=True, exist_ok=True)
    pages = [("cheatsheet", f"/?arch={arch}&point={point}"), ("throughput", "/throughput"),
             ("validation", "/validation"), *atlas_pages(db)]  # fmt: skip
    app = create_app(db, token=None)
    written: list[Path] = []
    with background_server(app) as base, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1560, "height": 1000}, device_scale_factor=1)
        page.goto(f"{base}/?arch={arch}&point={point}", wait_until="networkidle")
        written.append(_shot(page, out / "cheatsheet.png"))
        page.goto(f"{base}/throughput", wait_until="networkidle")
        written.append(_shot(page, out / "throughput.png"))
        page.goto(f"{base}/validation", wait_until="networkidle")
        cell = page.query_selector("table.matrix td.g a")
        if cell is not None:
            cell.click()
            page.wait_for_selector("#run .run")
        written.append(_shot(page, out / "validation.png"))
        for name, path in pages[3:]:
            page.goto(base + path, wait_until="networkidle")
            written.append(_shot(page, out / f"{name}.png"))
        for width in widths:
            page.set_viewport_size({"width": width, "height": 1000})
            for name, path in pages:
                page.goto(base + path, wait_until="networkidle")
                written.append(_shot(page, out / f"{name}-{width}.png"))
        browser.close()
    return written


def atlas_pages(db: Database) -> list[tuple[str, str]]:
    """(name, path) of the newest atlas's index and of its feature with the largest activation;
    none when no atlas is stored."""
    with db.read() as session:
        atlas = session.exec(select(AtlasRow).order_by(col(AtlasRow.id).desc())).first()
        if atlas is None:
            return []
        feature = session.exec(
            select(AtlasFeatureRow.feature)
            .where(AtlasFeatureRow.atlas_id == atlas.id)
            .order_by(col(AtlasFeatureRow.max_act).desc(), col(AtlasFeatureRow.feature).desc())
        ).first()
    return [
        ("atlas", f"/atlases/{atlas.id}"),
        ("feature", f"/atlases/{atlas.id}/features/{feature}"),
    ]


def _shot(page, path: Path, max_height: int = 1400) -> Path:  # type: ignore[no-untyped-def]
    """The page from the top, cut at `max_height` so a README image stays readable."""
    height = min(int(page.evaluate("document.documentElement.scrollHeight")), max_height)
    width = int(page.viewport_size["width"])
    page.screenshot(
        path=str(path), full_page=True, clip={"x": 0, "y": 0, "width": width, "height": height}
    )
    return path
