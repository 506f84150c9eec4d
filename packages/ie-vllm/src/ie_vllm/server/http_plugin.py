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

Every other POST with a JSON body passes the same screen: a `vllm_xargs` carrying
`ie_steering` or a server-set key anywhere in it is refused with 400 (never dropped), and text
that cannot fit the context is refused before vLLM tokenizes it (`http_limits`). With a key set,
`http_guard.KeyGuard` asks for it on every path but the liveness probes.

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

from ie_core.wire import PREFIX, RESERVED_XARGS, STEERING_XARG, steering_from_wire

from ie_vllm.host.engine import WORKER_EXTENSION, Engine, new_key
from ie_vllm.host.variant import GENERATE, HOOKED
from ie_vllm.server.http_errors import (
    BadRequest,
    declared_length,
    error_bytes,
    read_body,
    status_for,
)
from ie_vllm.server.http_guard import KeyGuard, server_keys
from ie_vllm.server.http_limits import Limits, check_text, limits_for, parse_json, text_bytes
from ie_vllm.specs import RequestSpec
from ie_vllm.worker.layout import KEY_ARG

OPENAI_PATHS = ("/v1/completions", "/v1/chat/completions")
IE_PREFIX = PREFIX + "/"  # ie's own routes read their JSON themselves
FORM_TYPES = (b"multipart/", b"application/x-www-form-urlencoded")


def _enabled(args: Namespace | None) -> bool:
    return getattr(args, "worker_extension_cls", None) == WORKER_EXTENSION


class IEEndpointPlugin:
    """`/v1/ie/*` routes and the steering middleware (see the module docstring)."""

    name = "interp-engine"
    required_tasks = ("generate",)

    def attach_router(self, app: Any) -> None:
        if not _enabled(getattr(app.state, "args", None)):
            return
        from ie_vllm.server.http_features import features_router
        from ie_vllm.server.http_patchscopes import patchscope_router
        from ie_vllm.server.http_routes import router

        app.include_router(router)
        app.include_router(features_router)
        app.include_router(patchscope_router)
        app.add_middleware(SteeringMiddleware)
        keys = server_keys(app.state.args)
        if keys:  # added last, so it runs first: no body is read for a request without the key
            app.add_middleware(KeyGuard, keys=keys)

    async def init_state(self, engine_client: Any, state: Any, args: Namespace) -> None:
        if engine_client is None or not _enabled(args):
            return
        state.ie_model = await served_model(engine_client, args)
        state.ie_limits = limits_for(state.ie_model, _max_model_len(engine_client, args))
        from ie_vllm.server.served_saes import SAES_ENV, load_served

        state.ie_saes = load_served(state.ie_model, os.environ.get(SAES_ENV))
        record_server_start(args)


def record_server_start(args: Namespace) -> None:
    """IE_ENGINE_LOG (`engine_log`): this server's engine, vLLM's own, is up; its start is
    timed from the `ie serve` process's start (`execv` keeps the pid)."""
    import sys
    import time

    import psutil

    from ie_vllm.host.engine_log import record_start
    from ie_vllm.server.serve_command import BACKEND_ENV

    name = (getattr(args, "served_model_name", None) or [args.model])[0]
    record_start(
        name,
        kind=f"server:{os.environ.get(BACKEND_ENV) or 'vllm'}",
        hooked=bool(getattr(args, "enforce_eager", False)),
        args={"argv": " ".join(sys.argv[3:])},  # `serve_main serve MODEL ...`: what follows
        seconds=time.time() - psutil.Process().create_time(),
        ok=True,
    )


def _max_model_len(engine_client: Any, args: Namespace) -> int:
    config = getattr(engine_client, "model_config", None)
    return int(getattr(config, "max_model_len", None) or args.max_model_len)


async def served_model(engine_client: Any, args: Namespace) -> Any:
    """The server's engine behind the `VLLMModel` host API (no second engine is started)."""
    from transformers import AutoTokenizer

    from ie_vllm.host.backend import VLLMModel
    from ie_vllm.host.lora import LORA_OPTIONS, HostAdapters
    from ie_vllm.pipeline import merge_infos
    from ie_vllm.row_budget import smallest_limit
    from ie_vllm.server.serve_command import BACKEND_ENV, served_backend

    module = served_backend(os.environ.get(BACKEND_ENV) or "vllm")
    if module is not None:  # an `ie.serve` backend (vllm-static) builds its own model
        return await module.served_model(engine_client, args)

    hooked = bool(getattr(args, "enforce_eager", False))
    info = merge_infos(await engine_client.collective_rpc("ie_setup", args=(hooked,)))
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.model)
    name = (getattr(args, "served_model_name", None) or [args.model])[0]
    row_limit = smallest_limit(await engine_client.collective_rpc("ie_row_limit"))
    backend = HOOKED if hooked else GENERATE
    model = VLLMModel(
        Engine(engine_client, ()), info, tokenizer, name, backend, row_limit=row_limit
    )
    # `--enable-lora` / `--max-lora-rank`: a plan's adapters are served as `load_model`'s are.
    lora_kw = {k: getattr(args, k, None) for k in LORA_OPTIONS}
    model.loras = HostAdapters(args.model, name, backend, lora_kw)
    return model


def plugin() -> IEEndpointPlugin:
    """The entry point vLLM calls (a zero-argument factory)."""
    return IEEndpointPlugin()


# --- steered OpenAI requests -----------------------------------------------------------------

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]


class SteeringMiddleware:
    """Pure ASGI: screens every JSON POST outside `/v1/ie` (steering refused where it is not
    applied, text bounded); on the two OpenAI routes rewrites `vllm_xargs.ie_steering` into a
    registered key and releases it after."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        headers = _Headers(scope)
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or scope["path"].startswith(IE_PREFIX)
            or (headers.get("content-type") or "").encode("latin-1").startswith(FORM_TYPES)
        ):
            await self.app(scope, receive, send)
            return
        try:
            declared_length(headers)
            new_body, key = await _screen(scope, await read_body(receive))
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


async def _screen(scope: dict[str, Any], body: bytes) -> tuple[bytes, str | None]:
    """(body to forward, registered key or None) for one POST outside `/v1/ie`."""
    try:
        data = parse_json(body)
    except (ValueError, UnicodeDecodeError):
        return body, None  # vLLM answers malformed JSON itself
    if not isinstance(data, dict):
        return body, None
    limits: Limits | None = getattr(scope["app"].state, "ie_limits", None)
    if limits is not None:
        check_text(limits, text_bytes(_texts(data)), "the request's prompt / messages")
    if scope["path"] not in OPENAI_PATHS:
        _refuse_xargs(data, scope["path"])
        return body, None
    return await _register_steering(scope, data, body)


def _texts(data: dict[str, Any]) -> list[str]:
    """The prompt text of a completions or chat body (what vLLM would tokenize)."""
    prompt, texts = data.get("prompt"), []
    for item in prompt if isinstance(prompt, list) else [prompt]:
        if isinstance(item, str):
            texts.append(item)
    messages = data.get("messages")
    for message in messages if isinstance(messages, list) else []:
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else [content]:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
    return texts


def _xargs_anywhere(data: Any) -> list[dict[str, Any]]:
    """Every `vllm_xargs` object in a body (a batch nests them), without recursion."""
    found, stack = [], [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if isinstance(item.get("vllm_xargs"), dict):
                found.append(item["vllm_xargs"])
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


def _refuse_xargs(data: dict[str, Any], path: str) -> None:
    """Refuse what this route would otherwise drop (steering) or trust (a server-set key)."""
    for xargs in _xargs_anywhere(data):
        for name in (STEERING_XARG, *RESERVED_XARGS):
            if name in xargs:
                raise BadRequest(
                    f"vllm_xargs.{name} is refused on {path}: steering is applied only on "
                    f"{' and '.join(OPENAI_PATHS)} (and POST /v1/ie/generate), and server-set "
                    "keys are never taken from a client"
                )


async def _register_steering(
    scope: dict[str, Any], data: dict[str, Any], body: bytes
) -> tuple[bytes, str | None]:
    """(body to forward, registered key or None) for one OpenAI request."""
    xargs = data.get("vllm_xargs")
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
        from ie_vllm.server.served_saes import resolve_steering

        saes = getattr(scope["app"].state, "ie_saes", None) or {}
        specs = steering_from_wire(resolve_steering(parse_json(raw.encode()), saes))
    except json.JSONDecodeError as exc:
        raise BadRequest(f"vllm_xargs.{STEERING_XARG} is not valid JSON: {exc}") from None
    model = scope["app"].state.ie_model
    if any(s.mask.positions or s.mask.special_tokens for s in specs):
        raise BadRequest(
            "position masks are not accepted on OpenAI requests (the server applies the chat "
            "template, so positions are not the client's); use POST /v1/ie/generate with prompt ids"
        )
    if specs:
        model.admission.require_points("steering")
    steer = model.admission.steer_specs(specs, ())
    key = new_key()
    xargs.update(await model.channel.attach(RequestSpec(key, (), steer, 0)))
    xargs[KEY_ARG] = key
    data["vllm_xargs"] = xargs
    data["cache_salt"] = key
    return json.dumps(data).encode(), key


async def _send_json(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


__all__ = ["BadRequest", "IEEndpointPlugin", "SteeringMiddleware", "plugin", "served_model"]
