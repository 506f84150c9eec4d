"""Render pages and fragments to HTML strings; the live app and the static export both call these."""

from __future__ import annotations

import json
from functools import cache

from ie_core.grammar import POINTS
from jinja2 import Environment, PackageLoader, StrictUndefined
from sqlmodel import Session, col, select

from ie_dashboard import (
    charts,
    diagram,
    graphs,
    provenance,
    quantized,
    snippets,
    validator_runs,
    views,
    workloads,
)
from ie_dashboard import fit_page as fit_page_mod
from ie_dashboard.links import Links
from ie_dashboard.notes import point_note
from ie_dashboard.tables import GraphRow

DEFAULT_ARCH = "llama"
GLYPHS = {
    "pass": "✓",
    "warn": "!",
    "fail": "✗",
    "unsupported": "–",
    "n/a": "–",
    "error": "✗",
    "not_run": "·",
}


def fmt_mult(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value:.1f}x" if value < 10 else f"{value:.0f}x"


def fmt_cos(value: float | None) -> str:
    """Cosines near 1 need their digits: 0.99999 must not print as 1."""
    return "-" if value is None else f"{value:.6f}"


def fmt_num(value: float | None) -> str:
    return (
        "-"
        if value is None
        else f"{value:.3g}"
        if abs(value) >= 1e-3 or value == 0
        else f"{value:.2e}"
    )


@cache
def env() -> Environment:
    # Autoescape everything: model names, reasons and details come from POSTed JSON.
    e = Environment(
        loader=PackageLoader("ie_dashboard", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    e.filters["rate"] = charts.fmt_rate
    e.filters["mult"] = fmt_mult
    e.filters["num"] = fmt_num
    e.filters["cos"] = fmt_cos
    e.globals["glyph"] = lambda status: GLYPHS.get(status, "?")
    # The footer's count, from the registry that seeds the points table (not a number in HTML).
    e.globals["point_count"] = len(POINTS)
    return e


def _render(template: str, links: Links, **ctx: object) -> str:
    return env().get_template(template).render(links=links, **ctx)


def card_context(
    session: Session, arch: views.Architecture, point: str, layer: int | None, stream: int = 0
) -> dict[str, object]:
    presence = arch.presence[point]
    serving = views.serving(presence, arch.slug)
    if layer is None:
        # The sample address must be one a backend serves: router_logits.0 is dense on Qwen3-MoE.
        served = sorted({i for s in serving for i in s.layers})
        layer = served[0] if served and snippets.SAMPLE_LAYER not in served else None
    model = arch.examples[0] if arch.examples else f"ie-synthetic/{arch.slug}"
    multi = "multi_stream" in arch.trait_names()
    if stream and not (multi and point in snippets.STREAM_POINTS):
        raise views.NotFound(
            f"{point} on {arch.name} has one residual stream; drop '.stream-{stream}'"
        )
    return {
        "arch": arch,
        "presence": presence,
        "p": presence.point,
        "layer": layer,
        "address": snippets.address_for(presence.point, layer, multi, stream),
        "multi_stream": multi and presence.point.name in snippets.STREAM_POINTS,
        "note": point_note(point, arch.trait_names()) if presence.present else "",
        "serving": serving,
        "quantized": quantized.verified_quantizations(session, arch.slug, point),
        "peers": views.peer_names(presence.point, layer),
        "snippets": snippets.snippets(presence.point, serving, model, layer, multi, stream),
        "model": model,
    }


def card(session: Session, links: Links, arch_slug: str, point_param: str) -> str:
    arch = views.get_architecture(session, arch_slug)
    point, layer = views.parse_point_param(point_param, arch.presence)
    assert point is not None
    stream = views.parse_point_stream(point_param)
    return _render("_card.html", links, ctx=card_context(session, arch, point, layer, stream))


def cheatsheet(
    session: Session, links: Links, arch_slug: str | None = None, point_param: str | None = None
) -> str:
    arch = views.get_architecture(session, arch_slug or DEFAULT_ARCH)
    point, layer = views.parse_point_param(point_param, arch.presence)
    stream = views.parse_point_stream(point_param)
    ctx = card_context(session, arch, point, layer, stream) if point else {}
    return _render(
        "cheatsheet.html",
        links,
        page="cheatsheet",
        arch=arch,
        architectures=views.list_architectures(session),
        layout=diagram.layout(parallel="parallel_block" in arch.trait_names()),
        selected=point,
        card=ctx,
    )


def compare(session: Session, links: Links, a: str, b: str) -> str:
    left, right = views.get_architecture(session, a), views.get_architecture(session, b)
    rows = views.compare(left, right)
    return _render(
        "compare.html",
        links,
        page="cheatsheet",
        left=left,
        right=right,
        rows=rows,
        absent_diff=sum(r.kind == "presence" for r in rows),
        meaning_diff=sum(r.kind == "meaning" for r in rows),
        architectures=views.list_architectures(session),
    )


def throughput(session: Session, links: Links) -> str:
    models = views.throughput(session)
    sections = workloads.workload_sections(session)
    return _render(
        "throughput.html",
        links,
        page="throughput",
        models=models,
        charts=[charts.chart(m) for m in models],
        one_stream=views.ONE_STREAM,
        concurrent=views.CONCURRENT,
        sections=sections,
        wcharts=[charts.section_chart(x) for x in sections],
        provenance=provenance.throughput_provenance(session),
    )


def validation(session: Session, links: Links) -> str:
    return _render(
        "validation.html",
        links,
        page="validation",
        matrix=validator_runs.validation_matrix(session),
        provenance=provenance.validator_provenance(session),
    )


def run_fragment(session: Session, links: Links, model: str, engine: str) -> str:
    return _render("_run.html", links, detail=validator_runs.run_detail(session, model, engine))


def validation_run(session: Session, links: Links, model: str, engine: str) -> str:
    detail = validator_runs.run_detail(session, model, engine)
    return _render("validation_run.html", links, page="validation", detail=detail)


def fit_page(links: Links, query: fit_page_mod.FitQuery) -> tuple[str, int]:
    """The memory page and its status: 400 when `ie fit` refuses the query."""
    result = fit_page_mod.fit_result(query)
    return _render("fit.html", links, page="fit", result=result), 200 if result.report else 400


def graph_list(session: Session, links: Links) -> str:
    rows = session.exec(select(GraphRow).order_by(col(GraphRow.id).desc())).all()
    return _render("graphs.html", links, page="graphs", rows=rows)


# Row ids are 32-bit on PostgreSQL; a larger id in a URL would fail in the driver (a 500), so it
# is a plain "no such graph" before any lookup.
MAX_ROW_ID = 2**31 - 1


def graph_row(session: Session, graph_id: int) -> GraphRow:
    row = session.get(GraphRow, graph_id) if 0 < graph_id <= MAX_ROW_ID else None
    if row is None:
        raise views.NotFound(f"no attribution graph {graph_id}; /graphs lists the stored ones")
    return row


def _graph_doc(session: Session, graph_id: int) -> tuple[GraphRow, graphs.GraphDoc]:
    row = graph_row(session, graph_id)
    # Stored rows were checked at ingest; checking again keeps the page and the API on one reading.
    return row, graphs.check_graph(json.loads(row.raw_json))


def _node_detail(doc: graphs.GraphDoc, node: str) -> graphs.NodeDetail:
    detail = graphs.node_detail(doc, node)
    if detail is None:
        raise views.NotFound(f"graph {doc.slug!r} has no node {node!r}")
    return detail


def graph_page(session: Session, links: Links, graph_id: int, node: str | None = None) -> str:
    row, doc = _graph_doc(session, graph_id)
    return _render(
        "graph.html",
        links,
        page="graphs",
        row=row,
        doc=doc,
        drawing=graphs.layout(doc),
        logits=graphs.logit_rows(doc),
        features=graphs.top_features(doc),
        detail=_node_detail(doc, node) if node else None,
    )


def graph_node_fragment(session: Session, links: Links, graph_id: int, node: str) -> str:
    row, doc = _graph_doc(session, graph_id)
    return _render("_graph_node.html", links, row=row, doc=doc, detail=_node_detail(doc, node))


def error(links: Links, status: int, message: str) -> str:
    return _render("error.html", links, page="", status=status, message=message)
