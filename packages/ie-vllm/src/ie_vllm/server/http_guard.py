"""The API key on every path of an `ie serve` server, not only the ones vLLM guards.

vLLM's own key middleware guards paths under `/v1` (and a few other prefixes); `/invocations`
(which generates), `/tokenize`, `/detokenize`, `/metrics`, `/openapi.json` and `/docs` answer
without it. With ie-vllm loaded and a key set, this guard asks for the same bearer key on every
path except the liveness probes a load balancer calls without credentials.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from argparse import Namespace
from collections.abc import Awaitable, Callable
from typing import Any

OPEN_PATHS = frozenset({"/health", "/ping"})  # liveness probes: no model output, no data
KEY_ENV = "VLLM_API_KEY"

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]


def server_keys(args: Namespace | None) -> tuple[str, ...]:
    """The keys vLLM itself accepts: `--api-key` (one or more), else `VLLM_API_KEY`."""
    given = getattr(args, "api_key", None) or [os.environ.get(KEY_ENV)]
    if isinstance(given, str):
        given = [given]
    return tuple(k for k in given if k)


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()


class KeyGuard:
    """Pure ASGI: 401 for a request without `Authorization: Bearer <key>` (OPTIONS pass)."""

    def __init__(self, app: Any, keys: tuple[str, ...]) -> None:
        self.app = app
        self._digests = tuple(_digest(k) for k in keys)

    def _authorized(self, scope: dict[str, Any]) -> bool:
        for name, value in scope.get("headers", ()):
            if name.lower() == b"authorization":
                scheme, _, token = bytes(value).decode("latin-1").partition(" ")
                given = _digest(token)
                match = False
                for digest in self._digests:  # no early exit: the time says nothing of the key
                    match |= hmac.compare_digest(given, digest)
                return scheme.lower() == "bearer" and match
        return False

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope.get("method") == "OPTIONS":
            await self.app(scope, receive, send)
            return
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if path in OPEN_PATHS or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps({"error": {"message": "Unauthorized", "type": "Unauthorized"}}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})


__all__ = ["OPEN_PATHS", "KeyGuard", "server_keys"]
