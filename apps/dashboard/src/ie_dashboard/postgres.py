"""PostgreSQL specifics: the engine behind a `postgresql://` URL and the locks writers take there.

SQLite has one writer at a time (BEGIN IMMEDIATE), so ingest's read-then-write is safe there as it
is. A server runs writers side by side, so the same guarantees come from advisory locks: one per
natural key for ingest, one for the registry refresh, one for the migration run.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlmodel import Session

EXTRA_HINT = "pip install 'ie-dashboard[postgresql]'"
_MIGRATION_LOCK = "ie-dashboard migrations"


class DriverMissing(RuntimeError):
    """The URL names a server whose Python driver is not installed."""


def server_url(url: str) -> URL:
    """`postgresql://` and `postgres://` mean psycopg 3 (the extra); an explicit driver is kept."""
    parsed = make_url(url.replace("postgres://", "postgresql://", 1))
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def server_engine(url: str, *, read_only: bool) -> Engine:
    """A pooled engine; `read_only` makes the server itself refuse every write on its sessions."""
    parsed = server_url(url)
    args: dict[str, str] = {}
    if read_only and parsed.get_backend_name() == "postgresql":
        args["options"] = "-c default_transaction_read_only=on"
    try:
        # pre_ping: after a server restart, pooled connections are dead; test each before use.
        return sa.create_engine(
            parsed, pool_pre_ping=True, pool_size=5, max_overflow=10, connect_args=args
        )
    except ModuleNotFoundError as exc:
        raise DriverMissing(
            f"the driver for {parsed.drivername} is not installed ({exc.name}); "
            f"for PostgreSQL: {EXTRA_HINT}"
        ) from None


def _lock(conn: Connection | Session, name: str) -> None:
    conn.execute(sa.text("SELECT pg_advisory_xact_lock(hashtextextended(:n, 0))"), {"n": name})


def claim(session: Session, name: str) -> None:
    """Hold `name` until this transaction ends, so writers of one key take turns on a server.

    A no-op on SQLite, whose write transactions already run one at a time.
    """
    if session.get_bind().dialect.name == "postgresql":
        _lock(session, name)


@contextmanager
def one_migrator(engine: Engine) -> Iterator[None]:
    """Workers starting together on one server migrate one at a time (the others then find the
    steps applied); the lock lives in a transaction held open on its own connection."""
    if engine.dialect.name != "postgresql":
        yield
        return
    with engine.begin() as conn:
        _lock(conn, _MIGRATION_LOCK)
        yield
