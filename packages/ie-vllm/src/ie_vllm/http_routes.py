"""The `/v1/ie/*` routes: the `InterpModel` protocol over HTTP, answered by the server's engine.

Requests are JSON (prompts as token ids, addresses, `sampling`, `steering` in `ie_core.wire`'s
form); tensors come back as safetensors named by address, with the request's facts (generated
ids, text) in the header metadata; residual rows go in as safetensors. Every error is JSON,
`{"error": {"message", "type"}}`, with a 4xx status when the request was at fault.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from ie_core.wire import (
    SAFETENSORS,
    decode_tensors,
    encode_tensors,
    sampling_from_wire,
    steering_from_wire,
)
from starlette.exceptions import HTTPException

from ie_vllm.http_errors import MAX_BODY, BadRequest, declared_length, error_body, status_for

Handler = Callable[[Request], Coroutine[Any, Any, Response]]


class RefusingRoute(APIRoute):
    """Every `/v1/ie` route answers an exception with `http_errors`' status and JSON sentence.

    A route class (not an app-wide exception handler) so vLLM's own routes keep their handlers.
    """

    def get_route_handler(self) -> Handler:
        handler = super().get_route_handler()

        async def refusing(request: Request) -> Response:
            try:
                return await handler(request)
            except HTTPException:
                raise
            except Exception as exc:
                return JSONResponse(error_body(exc), status_code=status_for(exc))

        return refusing


router = APIRouter(prefix="/v1/ie", route_class=RefusingRoute)


def _model(request: Request) -> Any:
    model = getattr(request.app.state, "ie_model", None)
    if model is None:
        raise BadRequest("the interp-engine worker extension is not set up on this server", 503)
    return model


async def _body(request: Request) -> bytes:
    declared_length(request.headers)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise BadRequest(f"the request body is over the {MAX_BODY}-byte limit", 413)
        chunks.append(chunk)
    return b"".join(chunks)


async def _json(request: Request) -> dict[str, Any]:
    body = await _body(request)
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadRequest("the request body must be a JSON object")
    return data


def _field(data: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    if name not in data:
        raise BadRequest(f"the request lacks the field {name!r}")
    value = data[name]
    if not isinstance(value, kind):
        raise BadRequest(f"{name!r} has the wrong type ({type(value).__name__})")
    return value


def _addresses(data: dict[str, Any]) -> list[str]:
    addresses = _field(data, "addresses", list)
    if not all(isinstance(a, str) for a in addresses):
        raise BadRequest("'addresses' must be a list of strings such as 'resid_post.3'")
    return addresses


def _tensors(data: dict[str, Any], meta: dict[str, Any] | None = None) -> Response:
    return Response(encode_tensors(data, meta), media_type=SAFETENSORS)


async def _rows(request: Request) -> Any:
    body = await _body(request)
    try:
        tensors, _ = decode_tensors(body)
    except Exception as exc:
        raise BadRequest(f"the body is not a safetensors payload with 'rows': {exc}") from None
    if "rows" not in tensors:
        raise BadRequest("the safetensors payload must hold a tensor named 'rows'")
    return tensors["rows"]


@router.get("/info")
async def info(request: Request) -> JSONResponse:
    m = _model(request)
    points = set(m.points())  # a vllm-static server lists only the points it declared
    widths = {a: w for a, w in m.info.get("widths", {}).items() if a.split(".")[0] in points}
    return JSONResponse(
        {
            "model_id": m.model_id,
            "backend": m.backend,
            "architecture": m.architecture,
            "n_layers": m.n_layers,
            "d_model": m.d_model,
            "points": list(m.points()),
            "widths": widths,
            "writable": m.info.get("writable", []),
            "refused": m.info.get("refused", {}),
            "vocab_size": m.info.get("vocab_size"),
        }
    )


@router.get("/stats")
async def stats(request: Request) -> JSONResponse:
    """The workers' registry: live request entries and installed hooks (0 and 0 when idle)."""
    return JSONResponse(await _model(request).stats())


@router.post("/capture")
async def capture(request: Request) -> Response:
    m, data = _model(request), await _json(request)
    prompts = _field(data, "prompts", (list, str))
    steering = steering_from_wire(data.get("steering") or [])
    cache = await m.capture(prompts, _addresses(data), steering=steering)
    return _tensors({str(a): t for a, t in cache.items()})


@router.post("/capture_generation")
async def capture_generation(request: Request) -> Response:
    m, data = _model(request), await _json(request)
    result = await m.capture_generation(
        _field(data, "prompt", (list, str)),
        _addresses(data),
        sampling_from_wire(data.get("sampling")),
        steering=steering_from_wire(data.get("steering") or []),
    )
    meta = asdict(result.generation)
    return _tensors({str(a): t for a, t in result.cache.items()}, meta)


@router.post("/generate")
async def generate(request: Request) -> JSONResponse:
    m, data = _model(request), await _json(request)
    gen = await m.generate(
        _field(data, "prompt", (list, str)),
        sampling_from_wire(data.get("sampling")),
        steering=steering_from_wire(data.get("steering") or []),
    )
    return JSONResponse(asdict(gen))


@router.post("/generate_stream")
async def generate_stream(request: Request) -> Response:
    """Newline-delimited JSON: one `{"token_id", "text"}` per token; an error ends the stream."""
    m, data = _model(request), await _json(request)
    prompt = _field(data, "prompt", (list, str))
    sampling = sampling_from_wire(data.get("sampling"))
    steering = steering_from_wire(data.get("steering") or [])
    stream = m.generate_stream(prompt, sampling, steering=steering)
    first = await anext(stream)  # validation errors surface here, before any 200

    async def lines() -> AsyncIterator[bytes]:
        try:
            yield (json.dumps(asdict(first)) + "\n").encode()
            async for chunk in stream:
                yield (json.dumps(asdict(chunk)) + "\n").encode()
        except Exception as exc:  # the 200 is sent: the error is the stream's last line
            yield (json.dumps(error_body(exc)) + "\n").encode()
        finally:
            await stream.aclose()

    return StreamingResponse(lines(), media_type="application/x-ndjson")


@router.post("/decode_residuals")
async def decode_residuals(request: Request) -> Response:
    m = _model(request)
    logits = await m.decode_residuals(await _rows(request))
    return _tensors({"logits": logits})


@router.post("/lens_topk")
async def lens_topk(request: Request) -> Response:
    m = _model(request)
    raw_k = request.query_params.get("k", "10")
    if not raw_k.isascii() or not raw_k.isdigit() or int(raw_k) < 1:
        raise BadRequest(f"k must be a positive integer, got {raw_k!r}")
    vocab = int(m.info.get("vocab_size") or 0) or len(m.tokenizer)
    if int(raw_k) > vocab:
        raise BadRequest(f"k={raw_k} is more than the vocabulary's {vocab} tokens")
    top = await m.decode_residuals_topk(await _rows(request), int(raw_k))
    return _tensors({"ids": top.ids, "probs": top.probs})


__all__ = ["RefusingRoute", "router"]
