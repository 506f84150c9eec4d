"""Capture and steering over HTTP, inside vLLM's own OpenAI-compatible server.

A `vllm.endpoint_plugins` entry point: vLLM builds its app, its engine client and its middleware
(API key included, for every path under `/v1`), then calls this plugin to add `/v1/ie/...` routes
and, once the engine is up, `init_state`, which runs `ie_setup` in the workers and wraps the
server's engine client in the same `VLLMModel` the in-process backend uses. So a request over
HTTP takes exactly the in-process path (registration, keys, release) on vLLM's scheduler.

Steered OpenAI requests: `vllm_xargs={"ie_steering": "<JSON list of specs>"}` on
`/v1/completions` or `/v1/chat/completions`. A middleware validates the specs, registers them
under a fresh key, rewrites the request to carry only that key (and a cache salt, so steered KV
is never shared), and releases the key when the response has been sent or the client has gone.

The plugin does nothing unless the server runs ie-vllm's worker extension (`ie serve` sets it),
so installing ie-vllm leaves a plain `vllm serve` unchanged.
"""

from __future__ import annotations

import contextlib
import json
import os
from argparse import Namespace
from collections.abc import Awaitable, Callable
from typing import Any

from ie_core.wire import RESERVED_XARGS, STEERING_XARG, steering_from_wire

from ie_vllm.engine import WORKER_EXTENSION, Engine, new_key
from ie_vllm.http_errors import BadRequest, declared_length, error_bytes, read_body, status_for
from ie_vllm.layout import KEY_ARG
from ie_vllm.registry import RequestSpec

OPENAI_PATHS = ("/v1/completions", "/v1/chat/completions")


def _enabled(args: Namespace | None) -> bool:
    return getattr(args, "worker_extension_cls", None) == WORKER_EXTENSION


class IEEndpointPlugin:
    """`/v1/ie/*` routes and the steering middleware (see the module docstring)."""

    name = "interp-engine"
    required_tasks = ("generate",)

    def attach_router(self, app: Any) -> None:
        if not _enabled(getattr(app.state, "args", None)):
            return
        from ie_vllm.http_routes import router

        app.include_router(router)
        app.add_middleware(SteeringMiddleware)

    async def init_state(self, engine_client: Any, state: Any, args: Namespace) -> None:
        if engine_client is None or not _enabled(args):
            return
        state.ie_model = await served_model(engine_client, args)


async def served_model(engine_client: Any, args: Namespace) -> Any:
    """The server's engine behind the `VLLMModel` host API (no second engine is started)."""
    from transformers import AutoTokenizer

    from ie_vllm.backend import GENERATE, HOOKED, VLLMModel
    from ie_vllm.serve_command import BACKEND_ENV, served_backend

    module = served_backend(os.environ.get(BACKEND_ENV) or "vllm")
    if module is not None:  # an `ie.serve` backend (vllm-static) builds its own model
        return await module.served_model(engine_client, args)

    hooked = bool(getattr(args, "enforce_eager", False))
    info = (await engine_client.collective_rpc("ie_setup", args=(hooked,)))[0]
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.model)
    name = (getattr(args, "served_model_name", None) or [args.model])[0]
    return VLLMModel(
        Engine(engine_client, ()), info, tokenizer, name, HOOKED if hooked else GENERATE
    )


def plugin() -> IEEndpointPlugin:
    """The entry point vLLM calls (a zero-argument factory)."""
    return IEEndpointPlugin()


# --- steered OpenAI requests -----------------------------------------------------------------

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]


class SteeringMiddleware:
    """Pure ASGI: rewrites `vllm_xargs.ie_steering` into a registered key; releases it after."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or scope["path"] not in OPENAI_PATHS
        ):
            await self.app(scope, receive, send)
            return
        try:
            declared_length(_Headers(scope))
            new_body, key = await _register_steering(scope, await read_body(receive))
        except Exception as exc:
            await _send_json(send, status_for(exc), error_bytes(exc))
            return
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": new_body, "more_body": False}
            return await receive()

        try:
            await self.app(scope, replay, send)
        finally:
            if key is not None:
                model = scope["app"].state.ie_model
                with contextlib.suppress(Exception):
                    await model.channel.release([key])


class _Headers:
    """The one header `declared_length` reads, from an ASGI scope."""

    def __init__(self, scope: dict[str, Any]) -> None:
        self._scope = scope

    def get(self, name: str) -> str | None:
        wanted = name.encode()
        for key, value in self._scope.get("headers", ()):
            if key.lower() == wanted:
                return bytes(value).decode("latin-1")
        return None


async def _register_steering(scope: dict[str, Any], body: bytes) -> tuple[bytes, str | None]:
    """(body to forward, registered key or None) for one OpenAI request."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return body, None  # vLLM answers malformed JSON itself
    xargs = data.get("vllm_xargs") if isinstance(data, dict) else None
    if not isinstance(xargs, dict):
        return body, None
    for reserved in RESERVED_XARGS:
        if reserved in xargs:
            raise BadRequest(
                f"vllm_xargs.{reserved} is set by the server; send specs as {STEERING_XARG}"
            )
    if STEERING_XARG not in xargs:
        return body, None
    raw = xargs.pop(STEERING_XARG)
    if not isinstance(raw, str):
        raise BadRequest(
            f"vllm_xargs.{STEERING_XARG} must be a JSON string (vllm_xargs values are flat)"
        )
    try:
        specs = steering_from_wire(json.loads(raw))
    except json.JSONDecodeError as exc:
        raise BadRequest(f"vllm_xargs.{STEERING_XARG} is not valid JSON: {exc}") from None
    model = scope["app"].state.ie_model
    if any(s.mask.positions or s.mask.special_tokens for s in specs):
        raise BadRequest(
            "position masks are not accepted on OpenAI requests (the server applies the chat "
            "template, so positions are not the client's); use POST /v1/ie/generate with prompt ids"
        )
    if specs:
        model._refuse_on_generate("steering")
    steer = model._steer_specs(specs, ())
    key = new_key()
    await model.channel.register([RequestSpec(key, (), steer, 0)])
    xargs[KEY_ARG] = key
    data["vllm_xargs"] = xargs
    data["cache_salt"] = key
    return json.dumps(data).encode(), key


async def _send_json(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


__all__ = ["BadRequest", "IEEndpointPlugin", "SteeringMiddleware", "plugin", "served_model"]
