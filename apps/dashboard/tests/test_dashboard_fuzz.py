"""Schema-driven fuzzing of the HTTP API from its own OpenAPI document (schemathesis).

Every operation, the token-guarded ingest included, gets schema-valid and schema-breaking inputs
(derandomized, a fixed number of examples) against a real SQLite file; no answer may be a 5xx.
The count of requests sent is printed in pytest's terminal summary (see conftest.py).
"""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

import schemathesis
from dashboard_fixtures import AUTH, TOKEN, make_cell, make_result
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from ie_dashboard.app import create_app
from ie_dashboard.config import database_url
from ie_dashboard.db import Database
from schemathesis.checks import not_a_server_error

EXAMPLES = 40  # per operation and generation mode
SENT: Counter[str] = Counter()

# schemathesis' lazy fixture loader reads a node attribute pytest 9.2 no longer has, so the app
# is built when the module is collected, on a SQLite file removed when the process exits.
_TMP = tempfile.TemporaryDirectory(prefix="ie-dashboard-fuzz-")
_DB = Database(database_url(Path(_TMP.name) / "fuzz.sqlite"))
_APP = create_app(_DB, token=TOKEN)
with TestClient(_APP) as _client:  # rows for the read endpoints and drill-downs to find
    assert _client.post("/api/benchmarks", json=make_cell(), headers=AUTH).status_code == 201
    assert _client.post("/api/validator", json=make_result(), headers=AUTH).status_code == 201
schema = schemathesis.openapi.from_asgi("/api/openapi.json", _APP)
schema.config.generation.update(
    modes=["positive", "negative"], max_examples=EXAMPLES, deterministic=True, database="none"
)


def summary() -> str:
    """The line conftest prints at the end of the session (the count is the report's figure)."""
    return f"dashboard fuzz: {sum(SENT.values())} requests over {len(SENT)} (method, path) pairs, no 5xx"


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_operation_answers_5xx(case) -> None:  # type: ignore[no-untyped-def]
    response = case.call(headers=AUTH)
    SENT[f"{case.method} {case.path}"] += 1
    case.validate_response(response, checks=[not_a_server_error])


def test_pages_render_what_the_fuzzer_stored() -> None:
    """Runs after the fuzzing above: every page renders over whatever ingest accepted."""
    with TestClient(_APP) as client:
        runs = client.get("/api/validator").json()
        assert len(runs) > 1 and len(client.get("/api/benchmarks").json()) > 1
        for path in ("/", "/throughput", "/validation", "/api/throughput"):
            assert client.get(path).status_code == 200, path
        for run in runs:
            params = {"model": run["hf_id"], "engine": run["engine"]}
            assert client.get("/validation/run", params=params).status_code == 200
