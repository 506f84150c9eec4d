"""The database handle: engine, migrations, read sessions and write transactions.

SQLite by default; a `postgresql://` URL uses a server (`postgres.py`). A database opens read-only
when asked (`ie dashboard --read-only`) or when its SQLite file or folder is not writable: then
nothing is migrated or seeded and the database itself (SQLite, or the server) refuses writes.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any
from urllib.parse import quote

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DBAPIError
from sqlmodel import Session

from ie_dashboard.config import database_url
from ie_dashboard.migrations import MIGRATIONS, applied_versions, migrate
from ie_dashboard.postgres import DriverMissing, server_engine

_WRITE = "ie_write"


class DatabaseError(RuntimeError):
    """The database cannot be used as asked; the message is one line saying why and what to do."""


def sqlite_file(url: str) -> str | None:
    """The file behind a SQLite URL; None for memory databases and other servers."""
    parsed = make_url(url)
    if not parsed.drivername.startswith("sqlite") or parsed.database in (None, "", ":memory:"):
        return None
    return parsed.database


def writable(path: str) -> bool:
    """SQLite writes the file and, in WAL mode, `-wal` / `-shm` files next to it."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.exists(path):
        return os.access(path, os.W_OK) and os.access(folder, os.W_OK)
    return os.access(folder, os.W_OK)


def _read_only_connect(path: str) -> sqlite3.Connection:
    """mode=ro: SQLite refuses every write, so a read-only start cannot change the file.

    A WAL database needs its `-shm` file; on a read-only file system where none exists SQLite
    cannot open it read-only, so it is opened `immutable` (nothing can change it there anyway).
    """
    uri = f"file:{quote(os.path.abspath(path))}?mode=ro"
    conn = sqlite3.connect(uri, uri=True, check_same_thread=False, timeout=60)
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.OperationalError as exc:
        conn.close()
        if "unable to open" not in str(exc):
            raise
        conn = sqlite3.connect(f"{uri}&immutable=1", uri=True, check_same_thread=False)
    return conn


def _sqlite_engine(url: str, read_only: bool) -> Engine:
    path = sqlite_file(url)
    if read_only and path is not None:
        engine = sa.create_engine("sqlite://", creator=lambda: _read_only_connect(path))
    else:
        engine = sa.create_engine(url, connect_args={"check_same_thread": False, "timeout": 60})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's begin event issue BEGIN itself, so writers can take the lock up front.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        if read_only:
            cur.execute("PRAGMA query_only=ON")
        else:
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

    def __init__(self, url: str | None = None, *, read_only: bool | None = None) -> None:
        """`read_only` None: read-only exactly when the SQLite file (or its folder) is not writable."""
        self.url = url or database_url()
        self.is_sqlite = self.url.startswith("sqlite")
        path = sqlite_file(self.url) if self.is_sqlite else None
        if read_only is None:
            read_only = path is not None and not writable(path)
        if read_only and path is not None and not os.path.exists(path):
            raise DatabaseError(
                f"{path} does not exist, and a read-only dashboard cannot create it"
            )
        self.read_only = read_only
        # What messages and logs show: a server URL's password is masked.
        self.label = make_url(self.url).render_as_string(hide_password=True)
        try:
            self.engine = (
                _sqlite_engine(self.url, read_only)
                if self.is_sqlite
                else server_engine(self.url, read_only=read_only)
            )
        except DriverMissing as exc:
            raise DatabaseError(str(exc)) from None
        self._writer = self.engine.execution_options(**{_WRITE: True})
        # SQLite has one writer at a time; queueing threads here beats spinning on busy_timeout.
        # A server runs writers side by side (ingest and the registry take advisory locks).
        self._lock: AbstractContextManager[object] = (
            threading.Lock() if self.is_sqlite else nullcontext()
        )

    def check(self) -> None:
        """Connect once: a file that is not a database, or an unmigrated read-only one, says so."""
        try:
            versions = applied_versions(self.engine)
        except DBAPIError as exc:
            reason = str(exc.orig).splitlines()[0] if exc.orig else type(exc).__name__
            fix = (
                "move the file aside or pass --db another path, and `ie dashboard seed` fills a new one"
                if self.is_sqlite
                else "check the URL (user, password, database name) and that the server is up"
            )
            raise DatabaseError(
                f"cannot read the dashboard database {self.label} ({reason}); {fix}"
            ) from None
        if self.read_only and len(versions) < len(MIGRATIONS):
            raise DatabaseError(
                f"the read-only database {self.label} is at schema version {max(versions, default=0)} "
                f"and this dashboard needs {len(MIGRATIONS)}; run `ie dashboard seed --db` on a "
                "writable copy to migrate it"
            )

    def migrate(self) -> list[int]:
        """Apply pending migrations; a read-only database is left as it is."""
        self.check()
        if self.read_only:
            return []
        with self._lock:
            return migrate(self._writer)

    @contextmanager
    def read(self) -> Iterator[Session]:
        with Session(self.engine) as session:
            yield session

    @contextmanager
    def write(self) -> Iterator[Session]:
        """One transaction: committed when the block exits, rolled back if it raises."""
        if self.read_only:
            raise DatabaseError(f"{self.label} is open read-only; nothing can be written")
        with self._lock, Session(self._writer, expire_on_commit=False) as session, session.begin():
            yield session

    def dispose(self) -> None:
        self.engine.dispose()
