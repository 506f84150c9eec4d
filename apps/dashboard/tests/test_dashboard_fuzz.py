"""Schema-driven fuzzing of the HTTP API from its own OpenAPI document (schemathesis).

Every operation, the token-guarded ingest included, gets schema-valid and schema-breaking inputs
(derandomized, a fixed number of examples) against a real SQLite file and against a database on
the test-started PostgreSQL server (conftest's `pg_server`); no answer may be a 5xx on either.
The count of requests sent is printed in pytest's terminal summary (see conftest.py).
"""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

import pytest
import schemathesis
from dashboard_fixtures import AUTH, BACKENDS, TOKEN, make_cell, make_result
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from ie_dashboard.app import create_app
from ie_dashboard.config import database_url
from ie_dashboard.db import Database
from schemathesis.checks import not_a_server_error

EXAMPLES = 40  # per operation and generation mode
SENT: Counter[str] = Counter()


def _seeded_app(url: str) -> FastAPI:
    app = create_app(Database(url), token=TOKEN)
    with TestClient(app) as client:  # rows for the read endpoints and drill-downs to find
        assert client.post("/api/benchmarks", json=make_cell(), headers=AUTH).status_code == 201
        assert client.post("/api/validator", json=make_result(), headers=AUTH).status_code == 201
    return app


# schemathesis' lazy fixture loader reads a node attribute pytest 9.2 no longer has, so the schema
# comes from an app built when the module is collected, on a SQLite file removed at exit; each
# case is then sent to the backend's app (`case.call(app=...)`).
_TMP = tempfile.TemporaryDirectory(prefix="ie-dashboard-fuzz-")
_APPS: dict[str, FastAPI] = {"sqlite": _seeded_app(database_url(Path(_TMP.name) / "fuzz.sqlite"))}
schema = schemathesis.openapi.from_asgi("/api/openapi.json", _APPS["sqlite"])
schema.config.generation.update(
    modes=["positive", "negative"], max_examples=EXAMPLES, deterministic=True, database="none"
)


def summary() -> str:
    """The line conftest prints at the end of the session (the count is the report's figure)."""
    return f"dashboard fuzz: {sum(SENT.values())} requests over {len(SENT)} (method, path) pairs, no 5xx"


@pytest.fixture(scope="module", params=BACKENDS)
def app(request: pytest.FixtureRequest) -> FastAPI:
    """The backend's app, seeded once per module (PostgreSQL: a database on the session server)."""
    if request.param not in _APPS:
        _APPS[request.param] = _seeded_app(request.getfixturevalue("pg_server").create_database())
    return _APPS[request.param]


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_operation_answers_5xx(case, app: FastAPI) -> None:  # type: ignore[no-untyped-def]
    response = case.call(headers=AUTH, app=app)
    SENT[f"{case.method} {case.path}"] += 1
    case.validate_response(response, checks=[not_a_server_error])


def test_pages_render_what_the_fuzzer_stored(app: FastAPI) -> None:
    """Runs after the fuzzing above: every page renders over whatever ingest accepted."""
    with TestClient(app) as client:
        runs = client.get("/api/validator").json()
        assert len(runs) > 1 and len(client.get("/api/benchmarks").json()) > 1
        for path in ("/", "/throughput", "/validation", "/api/throughput"):
            assert client.get(path).status_code == 200, path
        for run in runs:
            params = {"model": run["hf_id"], "engine": run["engine"]}
            assert client.get("/validation/run", params=params).status_code == 200
