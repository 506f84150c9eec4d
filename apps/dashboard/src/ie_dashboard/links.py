"""URLs for the live app and for the static export, so one set of templates renders both.

Live pages use query strings and htmx fragments; static pages are plain files linked relatively
(so the site works from `file://` or any static host), and htmx attributes are left out.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from urllib.parse import urlencode


def slug(text: str) -> str:
    """A file-name-safe form of a model id or engine name (`org/Model-1.5` -> `org--model-1.5`)."""
    text = text.strip().lower().replace("/", "--")
    return re.sub(r"[^a-z0-9._-]+", "-", text).strip("-") or "x"


def run_file(model: str, engine: str) -> str:
    """The static file of one (model, engine) drill-down: a readable slug, then a hash of the exact ids.

    The slug folds case and `/`, so `Org/Model`, `org/model` and `org--model` share it; the suffix
    (12 hex digits of SHA-256 over the exact pair) keeps them apart, also on case-insensitive file
    systems since it is lowercase. The export still refuses to write one file twice.
    """
    exact = json.dumps([model, engine], ensure_ascii=True).encode()
    return f"{slug(model)[:60]}__{slug(engine)[:40]}-{hashlib.sha256(exact).hexdigest()[:12]}"


@dataclass(frozen=True)
class Links:
    static: bool = False
    root: str = "/"  # live: "/"; static: the relative path from the page to the site root
    here: str = ""  # static: the page's folder, so links to its neighbours stay short

    @classmethod
    def for_static_page(cls, folder: str = "") -> Links:
        depth = len([p for p in folder.split("/") if p])
        return cls(static=True, root="../" * depth, here=folder)

    def _file(self, path: str) -> str:
        """A static site path relative to the current page."""
        if self.here and path.startswith(self.here + "/"):
            return path[len(self.here) + 1 :]
        return f"{self.root}{path}"

    def _q(self, path: str, **params: object) -> str:
        query = urlencode({k: v for k, v in params.items() if v is not None and v != ""})
        return f"{self.root}{path}" + (f"?{query}" if query else "")

    def asset(self, name: str) -> str:
        return f"{self.root}static/{name}"

    def home(self) -> str:
        return self._file("index.html") if self.static else self.root

    def cheatsheet(self, arch: str, point: str | None = None, layer: int | None = None) -> str:
        if self.static:
            return self._file(f"cheatsheet/{arch}/{point or 'index'}.html")
        address = point if layer is None or point is None else f"{point}.{layer}"
        return self._q("", arch=arch, point=address)

    def card_fragment(self, arch: str, point: str, layer: int | None = None) -> str | None:
        """The htmx fragment URL of a point card; None in the static site (plain links instead)."""
        if self.static:
            return None
        address = point if layer is None else f"{point}.{layer}"
        return self._q("fragments/card", arch=arch, point=address)

    def compare(self, a: str, b: str) -> str:
        if self.static:
            return self._file(f"compare/{a}--{b}.html")
        return self._q("compare", a=a, b=b)

    def throughput(self) -> str:
        return self._file("throughput/index.html") if self.static else f"{self.root}throughput"

    def validation(self) -> str:
        return self._file("validation/index.html") if self.static else f"{self.root}validation"

    def validation_run(self, model: str, engine: str) -> str:
        if self.static:
            return self._file(f"validation/{run_file(model, engine)}.html")
        return self._q("validation/run", model=model, engine=engine)

    def fit(self, model: str, engine: str) -> str | None:
        """The model's memory page (`ie fit`); None in the static site (no server to price)."""
        return None if self.static else self._q("fit", model=model, backend=engine)

    def fit_page(self) -> str:
        return self._q("fit")

    def run_fragment(self, model: str, engine: str) -> str | None:
        if self.static:
            return None
        return self._q("fragments/run", model=model, engine=engine)

    def graphs(self) -> str:
        return self._file("graphs/index.html") if self.static else f"{self.root}graphs"

    def graph(self, graph_id: int, node: str | None = None) -> str:
        """A graph's page; live, `node` deep-links to that node's details (static: the page)."""
        if self.static:
            return self._file(f"graphs/{graph_id}.html")
        return self._q(f"graphs/{graph_id}", node=node)

    def graph_node_fragment(self, graph_id: int, node: str) -> str | None:
        if self.static:
            return None
        return self._q("fragments/graph-node", graph=graph_id, node=node)
