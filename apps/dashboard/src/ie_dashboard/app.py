"""The FastAPI app: pages, htmx fragments, the JSON read API and the token-guarded ingest API."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Awaitable, Callable
from functools import partial
from importlib.resources import files
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from ie_core.capabilities import BACKENDS, cell
from ie_core.tooling.records import BenchmarkCell, ValidatorResult
from pydantic import BaseModel, ValidationError
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from ie_dashboard import guards, render, views
from ie_dashboard.body import MAX_BODY, BodyError, parse_json, read_limited
from ie_dashboard.config import READ_ONLY_ENV, TOKEN_ENV, database_url, write_token
from ie_dashboard.db import Database
from ie_dashboard.fit_page import FitQuery
from ie_dashboard.graphs import SMALLER, GraphError, check_graph
from ie_dashboard.ingest import upsert_cell, upsert_graph, upsert_validator
from ie_dashboard.links import Links
from ie_dashboard.migrations import applied_versions
from ie_dashboard.registry import seed_registry
from ie_dashboard.tables import (
    BenchmarkCellRow,
    GraphRow,
    ValidatorPointRow,
    ValidatorRunRow,
    WorkloadRow,
)

LIVE = Links()
_FROM_ENV = object()
__all__ = ["MAX_BODY", "create_app", "create_app_from_env"]


class ApiError(Exception):
    def __init__(
        self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(body)
        self.status, self.body, self.headers = status, body, headers


def create_app(db: Database | str | None = None, *, token: Any = _FROM_ENV) -> FastAPI:
    """Build the app on `db` (a Database, a file path or URL; default from config).

    Migrates the schema and refreshes the registry tables from ie-core, unless the database is
    read-only (then it only checks the schema is current, and the ingest API answers 403).
    `token` is the write token (default: `$IE_DASHBOARD_TOKEN`); None disables writes. Raises
    `db.DatabaseError` (one line) when the database cannot be opened.
    """
    database = db if isinstance(db, Database) else Database(None if db is None else _as_url(db))
    database.migrate()
    if not database.read_only:
        with database.write() as session:
            seed_registry(session)
    app = FastAPI(
        title="interp-engine dashboard", docs_url="/api/docs", openapi_url="/api/openapi.json"
    )
    app.state.db = database
    app.state.token = write_token() if token is _FROM_ENV else token
    app.mount(
        "/static", StaticFiles(directory=str(files("ie_dashboard") / "static")), name="static"
    )

    @app.exception_handler(views.NotFound)
    async def _not_found(request: Request, exc: views.NotFound) -> Any:
        if request.url.path.startswith("/api/"):
            return JSONResponse({"detail": str(exc)}, status_code=404)
        return HTMLResponse(render.error(LIVE, 404, str(exc)), status_code=404)

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body, status_code=exc.status, headers=exc.headers)

    guards.install(app)

    _pages(app, database)
    _read_api(app, database)
    _ingest_api(app, database)
    return app


def create_app_from_env() -> FastAPI:
    """The app each of `ie dashboard --workers N`'s processes builds: the database from
    `$DATABASE_URL` (read-only when `$IE_DASHBOARD_READ_ONLY` is 1), the token from the env."""
    read_only = True if os.environ.get(READ_ONLY_ENV) == "1" else None
    return create_app(Database(read_only=read_only))


def _as_url(db: str) -> str:
    return database_url(db)


def _page(database: Database, fn: Callable[[Session], str]) -> HTMLResponse:
    with database.read() as session:
        return HTMLResponse(fn(session))


def _pages(app: FastAPI, database: Database) -> None:
    @app.get("/", response_class=HTMLResponse)
    def cheatsheet(arch: str | None = None, point: str | None = None) -> HTMLResponse:
        return _page(database, lambda s: render.cheatsheet(s, LIVE, arch, point))

    @app.get("/fragments/card", response_class=HTMLResponse)
    def card(arch: str, point: str) -> HTMLResponse:
        return _page(database, lambda s: render.card(s, LIVE, arch, point))

    @app.get("/compare", response_class=HTMLResponse)
    def compare(a: str, b: str) -> HTMLResponse:
        return _page(database, lambda s: render.compare(s, LIVE, a, b))

    @app.get("/throughput", response_class=HTMLResponse)
    def throughput() -> HTMLResponse:
        return _page(database, lambda s: render.throughput(s, LIVE))

    @app.get("/validation", response_class=HTMLResponse)
    def validation() -> HTMLResponse:
        return _page(database, lambda s: render.validation(s, LIVE))

    @app.get("/validation/run", response_class=HTMLResponse)
    def validation_run(model: str, engine: str) -> HTMLResponse:
        return _page(database, lambda s: render.validation_run(s, LIVE, model, engine))

    @app.get("/fragments/run", response_class=HTMLResponse)
    def run_fragment(model: str, engine: str) -> HTMLResponse:
        return _page(database, lambda s: render.run_fragment(s, LIVE, model, engine))

    @app.get("/fit", response_class=HTMLResponse)
    def fit_page(
        model: str, backend: str = "vllm", gpu: str = "", tokens: int | None = None,
        attribute: int | None = None,
    ) -> HTMLResponse:  # fmt: skip
        query = FitQuery(model, backend, gpu, tokens, attribute)
        body, status = render.fit_page(LIVE, query)
        return HTMLResponse(body, status_code=status)

    @app.get("/graphs", response_class=HTMLResponse)
    def graph_list() -> HTMLResponse:
        return _page(database, lambda s: render.graph_list(s, LIVE))

    @app.get("/graphs/{graph_id}", response_class=HTMLResponse)
    def graph_page(graph_id: int, node: str | None = None) -> HTMLResponse:
        return _page(database, lambda s: render.graph_page(s, LIVE, graph_id, node))

    @app.get("/fragments/graph-node", response_class=HTMLResponse)
    def graph_node(graph: int, node: str) -> HTMLResponse:
        return _page(database, lambda s: render.graph_node_fragment(s, LIVE, graph, node))

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        return {
            "ok": True,
            "schema_versions": applied_versions(database.engine),
            "read_only": database.read_only,
        }


# ---------------------------------------------------------------- JSON read API


def _cell_json(session: Session, cell: BenchmarkCellRow) -> dict[str, Any]:
    workloads = session.exec(
        select(WorkloadRow).where(WorkloadRow.cell_id == cell.id).order_by(col(WorkloadRow.id))
    )
    return {
        "id": cell.id,
        "model": cell.model,
        "variant": cell.variant,
        "started": cell.started,
        "finished": cell.finished,
        "command": cell.command,
        "device": cell.device,
        "environment_label": cell.env_label,
        "environment": json.loads(cell.env_json),
        "cell_id": cell.cell_id,
        "profile": cell.profile,
        "status": cell.status,
        "source": cell.source,
        "workloads": [
            {
                "workload": w.workload,
                "status": w.status,
                "metrics": json.loads(w.metrics_json),
                "detail": w.detail,
            }
            for w in workloads
        ],
    }


def _run_json(session: Session, run: ValidatorRunRow, with_points: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": run.id,
        "hf_id": run.hf_id,
        "engine": run.engine,
        "reference": run.reference,
        "verdict": run.verdict,
        "captured_at": run.captured_at,
        "status": run.status,
        "dtype": run.dtype,
        "device": run.device,
        "versions": json.loads(run.versions_json),
        "family": run.family,
        "error": run.error,
        "source": run.source,
    }
    if with_points:
        rows = session.exec(
            select(ValidatorPointRow)
            .where(ValidatorPointRow.run_id == run.id)
            .order_by(col(ValidatorPointRow.id))
        )
        out["points"] = [r.model_dump(exclude={"id", "run_id"}) for r in rows]
    return out


def _read_api(app: FastAPI, database: Database) -> None:
    @app.get("/api/points")
    def points() -> list[dict[str, Any]]:
        with database.read() as s:
            return [p.model_dump() for p in views.list_points(s)]

    @app.get("/api/architectures")
    def architectures() -> list[dict[str, Any]]:
        with database.read() as s:
            return [
                _arch_json(views.get_architecture(s, a.slug)) for a in views.list_architectures(s)
            ]

    @app.get("/api/architectures/{slug}")
    def architecture(slug: str) -> dict[str, Any]:
        with database.read() as s:
            return _arch_json(views.get_architecture(s, slug))

    @app.get("/api/benchmarks")
    def benchmarks(model: str | None = None, variant: str | None = None) -> list[dict[str, Any]]:
        with database.read() as s:
            q = select(BenchmarkCellRow).order_by(col(BenchmarkCellRow.id))
            if model:
                q = q.where(BenchmarkCellRow.model == model)
            if variant:
                q = q.where(BenchmarkCellRow.variant == variant)
            return [_cell_json(s, c) for c in s.exec(q)]

    @app.get("/api/throughput")
    def throughput() -> list[dict[str, Any]]:
        with database.read() as s:
            return [
                {
                    "model": m.model,
                    "profile": m.profile,
                    "concurrency": m.concurrency,
                    "environments": m.environments,
                    "figures": [f.__dict__ for f in m.figures],
                }
                for m in views.throughput(s)
            ]

    @app.get("/api/validator")
    def validator(
        model: str | None = None, engine: str | None = None, points: bool = False
    ) -> list[dict[str, Any]]:
        with database.read() as s:
            q = select(ValidatorRunRow).order_by(col(ValidatorRunRow.id))
            if model:
                q = q.where(ValidatorRunRow.hf_id == model)
            if engine:
                q = q.where(ValidatorRunRow.engine == engine)
            return [_run_json(s, r, points) for r in s.exec(q)]

    @app.get("/api/graphs")
    def graph_rows() -> list[dict[str, Any]]:
        with database.read() as s:
            return [_graph_json(r) for r in s.exec(select(GraphRow).order_by(col(GraphRow.id)))]

    @app.get("/api/graphs/{graph_id}")
    def graph_one(graph_id: int) -> dict[str, Any]:
        with database.read() as s:
            row = render.graph_row(s, graph_id)
            return {**_graph_json(row), "graph": json.loads(row.raw_json)}


def _graph_json(row: GraphRow) -> dict[str, Any]:
    return row.model_dump(exclude={"raw_json", "graph_key"})


def _arch_json(arch: views.Architecture) -> dict[str, Any]:
    return {
        **arch.row.model_dump(exclude={"position"}),
        "hf_classes": arch.hf_classes,
        "examples": arch.examples,
        "traits": [t for t, _ in arch.traits],
        "points": [name for name, p in arch.presence.items() if p.present],
        "missing": {name: p.reason for name, p in arch.presence.items() if not p.present},
        # Per backend and point: "served", "refused: <reason>" or "not verified" (committed sweeps).
        "backends": {
            b: {name: cell(b, arch.slug, name) for name in arch.presence} for b in BACKENDS
        },
    }


# ---------------------------------------------------------------- ingest API


def _authorize(request: Request) -> None:
    """401 without a bearer token, 403 with a wrong one (or when the server has none set)."""
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    challenge = {"WWW-Authenticate": "Bearer"}
    if not header or scheme.lower() != "bearer" or not value.strip():
        raise ApiError(
            401, {"detail": "missing write token: send 'Authorization: Bearer <token>'"}, challenge
        )
    expected = request.app.state.token
    if not expected:
        raise ApiError(
            403, {"detail": f"writes are disabled: start the server with {TOKEN_ENV} set"}
        )
    if not secrets.compare_digest(value.strip().encode(), str(expected).encode()):
        raise ApiError(403, {"detail": "wrong write token"})


async def _parse(request: Request, schema: type[BaseModel], what: str) -> Any:
    """The body as `schema`; size and depth are checked before anything is parsed."""
    try:
        raw = await read_limited(request.stream(), request.headers.get("content-length"))
        data = parse_json(raw)
    except BodyError as exc:
        detail = [{"loc": ["body"], "msg": exc.message, "type": exc.kind}]
        raise ApiError(
            exc.status, {"detail": detail, "error": f"invalid {what}: {exc.message}"}
        ) from None
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        errors = [
            {"loc": ["body", *e["loc"]], "msg": e["msg"], "type": e["type"]}
            for e in exc.errors(include_url=False, include_context=False, include_input=False)
        ]
        first = errors[0]
        field = ".".join(str(x) for x in first["loc"][1:]) or "body"
        raise ApiError(
            422, {"detail": errors, "error": f"invalid {what}: {field}: {first['msg']}"}
        ) from None


def _store(
    database: Database, upsert: Callable[..., tuple[int, bool]], item: BaseModel
) -> tuple[int, bool]:
    """One transaction; retried once if a concurrent writer inserted the same key first.

    Writers of one key take turns (SQLite: one writer at a time; a server: the ingest's advisory
    lock per key), so this is a last line of defence rather than the mechanism.
    """
    for attempt in (0, 1):
        try:
            with database.write() as s:
                return upsert(s, item, source="api")
        except IntegrityError:
            if attempt:
                raise
    raise AssertionError("unreachable")


_INGEST_ERRORS = {
    "401": {"description": "no bearer token"},
    "403": {"description": "wrong token, writes disabled, or a read-only dashboard"},
    "413": {"description": "body over the size limit"},
    "422": {"description": "not strict JSON (too deep, NaN, ...) or not the schema"},
}


def _ingest_doc(schema: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI operation extras: the body is parsed by hand (bounded first), so say its schema."""
    ref = {"$ref": f"#/components/schemas/{schema.__name__}"}
    return {
        "requestBody": {"required": True, "content": {"application/json": {"schema": ref}}},
        "security": [{"bearer": []}],
    }


def _openapi_with_bodies(app: FastAPI) -> Callable[[], dict[str, Any]]:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
            components = doc.setdefault("components", {})
            schemas = components.setdefault("schemas", {})
            for model in (BenchmarkCell, ValidatorResult):
                body = model.model_json_schema(
                    by_alias=True, ref_template="#/components/schemas/{model}"
                )
                schemas.update(body.pop("$defs", {}))
                schemas[model.__name__] = body
            components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
            app.openapi_schema = doc
        return app.openapi_schema

    return openapi


def _graph_doc() -> dict[str, Any]:
    """The graph's body in OpenAPI: the viewer's format is checked by hand (`graphs.py`)."""
    body = {
        "type": "object",
        "required": ["metadata", "nodes", "links"],
        "properties": {
            "metadata": {"type": "object"},
            "nodes": {"type": "array", "items": {"type": "object"}},
            "links": {"type": "array", "items": {"type": "object"}},
        },
    }
    return {
        "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
        "security": [{"bearer": []}],
    }


async def _parse_graph(request: Request) -> Any:
    """The body as a checked graph: 413 over the body or graph size limits, else 400 with why."""
    try:
        raw = await read_limited(request.stream(), request.headers.get("content-length"))
        data = parse_json(raw)
        check_graph(data)
    except BodyError as exc:
        status = 413 if exc.status == 413 else 400
        hint = f": {SMALLER}" if status == 413 else ""
        raise ApiError(
            status, {"detail": f"invalid attribution graph: {exc.message}{hint}"}
        ) from None
    except GraphError as exc:
        raise ApiError(
            exc.status, {"detail": f"invalid attribution graph: {exc.message}"}
        ) from None
    return data


def _refuse_if_read_only(database: Database) -> None:
    if database.read_only:
        raise ApiError(
            403,
            {"detail": "this dashboard is read-only (started with --read-only, or its database "
             "file is not writable); post to a writable instance"},
        )  # fmt: skip


def _ingest_route(schema: type[BaseModel]) -> dict[str, Any]:
    """The `app.post` options of a route whose body is one `schema` record."""
    return {"status_code": 201, "responses": _INGEST_ERRORS, "openapi_extra": _ingest_doc(schema)}


async def _ingest(
    request: Request,
    database: Database,
    read: Callable[[Request], Awaitable[Any]],
    upsert: Callable[..., tuple[int, bool]],
) -> JSONResponse:
    """What every ingest route does, in this order: read-only and token checks before the body is
    read, then one stored row: 201 when it is new, 200 when it replaced one with the same key."""
    _refuse_if_read_only(database)
    _authorize(request)
    item = await read(request)
    row_id, created = await run_in_threadpool(_store, database, upsert, item)
    return JSONResponse({"id": row_id, "created": created}, status_code=201 if created else 200)


def _ingest_api(app: FastAPI, database: Database) -> None:
    @app.post("/api/benchmarks", **_ingest_route(BenchmarkCell))
    async def post_benchmark(request: Request) -> JSONResponse:
        read = partial(_parse, schema=BenchmarkCell, what="benchmark cell")
        return await _ingest(request, database, read, upsert_cell)

    @app.post("/api/validator", **_ingest_route(ValidatorResult))
    async def post_validator(request: Request) -> JSONResponse:
        read = partial(_parse, schema=ValidatorResult, what="validator result")
        return await _ingest(request, database, read, upsert_validator)

    @app.post(
        "/api/graphs",
        status_code=201,
        responses={
            **_INGEST_ERRORS,  # type: ignore[dict-item]
            "400": {"description": "not JSON, or not an attribution graph (the reason says which)"},
            "413": {"description": "body over the size limit, or more nodes / links than accepted"},
        },
        openapi_extra=_graph_doc(),
    )
    async def post_graph(request: Request) -> JSONResponse:
        return await _ingest(request, database, _parse_graph, upsert_graph)

    app.openapi = _openapi_with_bodies(app)  # type: ignore[method-assign]
