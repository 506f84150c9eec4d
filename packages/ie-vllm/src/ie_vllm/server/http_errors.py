"""How the server refuses a request: one mapping from errors to HTTP statuses, one JSON shape.

Every refusal is `{"error": {"message", "type"}}` with the sentence of the error that caused it
(`type` names the `ie_core.errors` class, which the remote backend raises again). A request at
fault gets a 4xx; a server that cannot answer (engine stopped) a 503; only a bug is a 500.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from ie_core.errors import (
    EngineStoppedError,
    InterpError,
    ModelClosedError,
    PointUnavailableError,
    UnsupportedOperationError,
)

MAX_BODY = 64 * 2**20  # bytes: a request carrying more than this many bytes is refused (413)
MAX_MESSAGE = 1000  # characters of an error's sentence sent back: errors never echo bulk input

Receive = Callable[[], Awaitable[dict[str, Any]]]


class BadRequest(Exception):
    """A request the server refuses with a 4xx and a sentence."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def status_for(exc: BaseException) -> int:
    """The HTTP status of a refusal (see the module docstring)."""
    if isinstance(exc, BadRequest):
        return exc.status
    if isinstance(exc, EngineStoppedError | ModelClosedError):
        return 503
    if isinstance(exc, PointUnavailableError | UnsupportedOperationError):
        return 422  # well-formed, but this backend or model cannot serve it
    if isinstance(exc, RecursionError):
        return 400  # input nested deeper than a parser or serializer can follow
    if any(c.__name__ == "VLLMClientError" for c in type(exc).__mro__):
        return 400  # vLLM's own validation (sampling ranges): named so vllm is not imported here
    # ValueError / TypeError / KeyError come from validating the request's values (a JSON number
    # where a list belongs, a sampling field of the wrong type) before any engine work.
    if isinstance(exc, InterpError | ValueError | TypeError | KeyError):
        return 400
    return 500


def error_body(exc: BaseException) -> dict[str, Any]:
    message = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    if len(message) > MAX_MESSAGE:
        message = f"{message[:MAX_MESSAGE]}... ({len(message) - MAX_MESSAGE} characters more)"
    return {"error": {"message": message or type(exc).__name__, "type": type(exc).__name__}}


def error_bytes(exc: BaseException) -> bytes:
    return json.dumps(error_body(exc)).encode()


def declared_length(headers: Any) -> int | None:
    """The request's Content-Length (refused when over `MAX_BODY` or malformed)."""
    raw = headers.get("content-length") if headers is not None else None
    if raw is None:
        return None
    if not raw.isascii() or not raw.isdigit():
        raise BadRequest(f"Content-Length {raw!r} is not a byte count")
    if int(raw) > MAX_BODY:
        raise BadRequest(f"the request body of {raw} bytes is over the {MAX_BODY}-byte limit", 413)
    return int(raw)


async def read_body(receive: Receive) -> bytes:
    """The whole ASGI request body, refused with a 413 as soon as it passes `MAX_BODY`."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise BadRequest("the client went away before sending the whole body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise BadRequest(f"the request body is over the {MAX_BODY}-byte limit", 413)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


__all__ = [
    "MAX_BODY",
    "MAX_MESSAGE",
    "BadRequest",
    "declared_length",
    "error_body",
    "error_bytes",
    "read_body",
    "status_for",
]
