"""Where the database is and who may write to it."""

from __future__ import annotations

import os
from pathlib import Path

from ie_core.models import cache_dir

TOKEN_ENV = "IE_DASHBOARD_TOKEN"
DATABASE_ENV = "DATABASE_URL"
READ_ONLY_ENV = "IE_DASHBOARD_READ_ONLY"  # set by `ie dashboard --workers N` for its processes


def default_db_path() -> Path:
    return cache_dir() / "dashboard.sqlite"


def database_url(db: str | os.PathLike[str] | None = None) -> str:
    """`db` (a file path or a URL) wins, then `$DATABASE_URL`, then the default SQLite file."""
    if db is not None:
        text = os.fspath(db)
        return text if "://" in text else sqlite_url(Path(text))
    env = os.environ.get(DATABASE_ENV)
    if env:
        return env
    return sqlite_url(default_db_path())


def sqlite_url(path: Path) -> str:
    path = path.expanduser().resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def write_token() -> str | None:
    """The bearer token writes need; None disables writes."""
    return os.environ.get(TOKEN_ENV) or None
