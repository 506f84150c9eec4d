"""App fixtures on a real SQLite file per test."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from dashboard_fixtures import TOKEN
from fastapi.testclient import TestClient
from ie_dashboard.app import create_app
from ie_dashboard.config import database_url
from ie_dashboard.db import Database


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "dashboard.sqlite"


@pytest.fixture
def db(db_path: Path) -> Iterator[Database]:
    database = Database(database_url(db_path))
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
