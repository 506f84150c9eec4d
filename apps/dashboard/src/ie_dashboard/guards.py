"""What a database cannot take, answered before it becomes a 500.

- A NUL character (`%00`) in the path or query: PostgreSQL text cannot hold it, so the lookup it
  would feed fails in the driver; it is refused as 400 on every backend alike.
- A database that went away (a server restarting, a connection cut mid-request): 503 with
  Retry-After, since retrying the same request is the fix; ingest is idempotent, so a retried
  post never duplicates a row.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from urllib.parse import unquote_to_bytes

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from sqlalchemy.exc import InterfaceError, OperationalError

RETRY_AFTER_S = 2


def _holds_nul(request: Request) -> bool:
    raw = request.scope.get("raw_path") or request.url.path.encode()
    return b"\x00" in unquote_to_bytes(raw) or b"\x00" in unquote_to_bytes(request.url.query)


def install(app: FastAPI) -> None:
    """Register the NUL check (a middleware) and the database-unavailable handler on `app`."""

    @app.middleware("http")
    async def _refuse_nul(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        if _holds_nul(request):
            return JSONResponse(
                {"detail": "the URL holds a NUL character (%00), which no lookup can match"},
                status_code=400,
            )
        return await call_next(request)

    async def _unavailable(_request: Request, exc: Exception) -> JSONResponse:
        lines = str(getattr(exc, "orig", None) or exc).strip().splitlines()
        reason = lines[0] if lines else type(exc).__name__
        return JSONResponse(
            {"detail": f"the database is unavailable ({reason}); retry the request"},
            status_code=503,
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )

    app.add_exception_handler(OperationalError, _unavailable)
    app.add_exception_handler(InterfaceError, _unavailable)
