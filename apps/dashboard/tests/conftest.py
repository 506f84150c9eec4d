"""App fixtures on a real database per test: a SQLite file, and a database on a PostgreSQL server
the session starts itself (`postgres_server.py`); `db` and `client` run each test on both."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from dashboard_fixtures import BACKENDS, TOKEN
from fastapi.testclient import TestClient
from ie_dashboard.app import create_app
from ie_dashboard.config import database_url
from ie_dashboard.db import Database


@pytest.fixture(scope="session")
def pg_server() -> Iterator[object]:
    """One server for the session; each test that wants one gets its own database on it."""
    from postgres_server import remove, start_server

    server = start_server()
    yield server
    remove(server)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "dashboard.sqlite"


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, db_path: Path) -> str:
    """A fresh, empty database of each backend."""
    if request.param == "sqlite":
        return database_url(db_path)
    return request.getfixturevalue("pg_server").create_database()


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    database = Database(db_url)
    yield database
    database.dispose()


@pytest.fixture
def client(db: Database) -> Iterator[TestClient]:
    with TestClient(create_app(db, token=TOKEN)) as c:
        yield c


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """How many requests the schema fuzz sent, when it ran in this session."""
    fuzz = sys.modules.get("test_dashboard_fuzz")
    if fuzz is not None and fuzz.SENT:
        terminalreporter.write_line(fuzz.summary())
