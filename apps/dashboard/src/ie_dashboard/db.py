"""The database handle: engine, migrations, read sessions and serialized write transactions."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlmodel import Session

from ie_dashboard.config import database_url
from ie_dashboard.migrations import migrate

_WRITE = "ie_write"


def _sqlite_engine(url: str) -> Engine:
    engine = sa.create_engine(url, connect_args={"check_same_thread": False, "timeout": 60})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's begin event issue BEGIN itself, so writers can take the lock up front.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA busy_timeout=60000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        # IMMEDIATE takes the write lock at BEGIN: a writer that read first could otherwise fail
        # with SQLITE_BUSY instead of waiting when another process wrote in between.
        immediate = conn.get_execution_options().get(_WRITE, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


class Database:
    """One database: `read()` for queries, `write()` for one serialized transaction."""

    def __init__(self, url: str | None = None) -> None:
        self.url = url or database_url()
        self.is_sqlite = self.url.startswith("sqlite")
        self.engine = _sqlite_engine(self.url) if self.is_sqlite else sa.create_engine(self.url)
        self._writer = self.engine.execution_options(**{_WRITE: True})
        # SQLite has one writer at a time; queueing threads here beats spinning on busy_timeout.
        self._lock = threading.Lock()

    def migrate(self) -> list[int]:
        with self._lock:
            return migrate(self._writer)

    @contextmanager
    def read(self) -> Iterator[Session]:
        with Session(self.engine) as session:
            yield session

    @contextmanager
    def write(self) -> Iterator[Session]:
        """One transaction: committed when the block exits, rolled back if it raises."""
        with self._lock, Session(self._writer, expire_on_commit=False) as session, session.begin():
            yield session

    def dispose(self) -> None:
        self.engine.dispose()
