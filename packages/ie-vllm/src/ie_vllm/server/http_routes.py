"""The `/v1/ie/*` routes: the `InterpModel` protocol over HTTP, answered by the server's engine.

Requests are JSON: a plan's (`ie_core.plan.Plan.to_wire`: prompts as text or token ids,
addresses, `sampling`, `steering`, `reductions`); tensors come back as safetensors named by
address (a reduction's outputs as `label|output`), with the request's facts (generated ids, text)
in the header metadata; residual rows go in as safetensors (a decode plan: the lens on them). The read-outs reduced in the workers
(features, probe scores) are capture plans with reductions, on their own paths too. Every error is JSON,
`{"error": {"message", "type"}}`, with a 4xx status when the request was at fault.

Before any work: text is bounded by bytes and then tokenized in a thread, sampling is checked
against vLLM's ranges and the response's size against the server's cap (`http_limits`); tensors
are decoded and encoded in a thread, so the event loop (and `/health`) never waits on them; a
client that goes away before its answer has its request cancelled, which aborts it in the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import asdict, replace
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from ie_core.grammar import to_address
from ie_core.plan import CAPTURE, CAPTURE_GENERATION, DECODE, GENERATE, Plan
from ie_core.protocol import StreamChunk
from ie_core.reduce import LensTopK, Reduction, flat
from ie_core.wire import (
    PREFIX,
    ROUTES,
    SAFETENSORS,
    decode_tensors,
    encode_tensors,
    steering_from_wire,
)
from starlette.exceptions import HTTPException

from ie_vllm.server.http_errors import MAX_BODY, BadRequest, declared_length, error_body, status_for
from ie_vllm.server.http_limits import (
    Limits,
    capture_bytes,
    check_response,
    check_rows,
    check_sampling,
    check_text,
    parse_json,
    text_bytes,
)
from ie_vllm.server.served_saes import resolve_reductions, resolve_steering

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


router = APIRouter(prefix=PREFIX, route_class=RefusingRoute)


def mount(name: str) -> dict[str, Any]:
    """The path and method of route `name`, from the table the remote backend calls."""
    route = ROUTES[name]
    return {"path": route.path, "methods": [route.method]}


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
        data = parse_json(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadRequest("the request body must be a JSON object")
    return data


async def _tensors(data: dict[str, Any], meta: dict[str, Any] | None = None) -> Response:
    body = await asyncio.to_thread(encode_tensors, data, meta)
    return Response(body, media_type=SAFETENSORS)


async def _rows(request: Request, d_model: int) -> Any:
    body = await _body(request)
    try:
        tensors, _ = await asyncio.to_thread(decode_tensors, body)
    except Exception as exc:
        raise BadRequest(f"the body is not a safetensors payload with 'rows': {exc}") from None
    if "rows" not in tensors:
        raise BadRequest("the safetensors payload must hold a tensor named 'rows'")
    check_rows(tensors["rows"], d_model)
    return tensors["rows"]


def _limits(request: Request) -> Limits:
    return request.app.state.ie_limits


def _texts(prompt: Any) -> list[str]:
    items = prompt if isinstance(prompt, list) else [prompt]
    return [p for p in items if isinstance(p, str)]


def served_saes(request: Request) -> dict[str, Any]:
    """The dictionaries named at start-up (`ie serve --sae NAME=SOURCE`), by name."""
    return getattr(request.app.state, "ie_saes", None) or {}


async def _batch(m: Any, limits: Limits, prompts: Any) -> list[tuple[int, ...]]:
    """Token ids of a batch of prompts; text bounded first, tokenized in a thread."""
    check_text(limits, text_bytes(_texts(prompts)), "the prompt")
    return await asyncio.to_thread(m.admission.prompts, prompts)


def _steering(request: Request, data: dict[str, Any]) -> Any:
    """A request's steering specs, its named feature ops resolved against the served ones."""
    return steering_from_wire(_resolver(request)(data.get("steering") or []))


def _resolver(request: Request) -> Callable[[list[Any]], list[Any]]:
    """Steering specs with the served dictionaries' named feature ops made plain ops."""
    return lambda specs: resolve_steering(specs, served_saes(request))


def _canonical(addresses: Sequence[Any]) -> list[str]:
    out = []
    for a in addresses:
        with contextlib.suppress(Exception):  # an unknown address is refused by the model
            out.append(str(to_address(a)))
    return list(dict.fromkeys(out))


# After a disconnect, how long to look for the engine's own stop reason: a server stopping because
# its engine died disconnects its requests, and the engine's error names the cause, a 499 would not
# (on a loaded 2-core machine a dead replica took over 1 s to show). The work itself is aborted at
# once; only this check waits.
DISCONNECT_GRACE_S = 5.0


async def _stop_reason_within_grace(request: Request) -> Exception | None:
    """Why the engine stopped, if it shows within the grace (checked every 0.1 s)."""
    model, loop = _model(request), asyncio.get_running_loop()
    deadline = loop.time() + DISCONNECT_GRACE_S
    while (stopped := model.stop_reason()) is None and loop.time() < deadline:
        await asyncio.sleep(0.1)
    return stopped


async def _unless_gone(request: Request, work: Awaitable[Any]) -> Any:
    """`work`'s result, or its cancellation (an abort in the engine) once the client has gone."""
    task = asyncio.ensure_future(work)

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(gone())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():  # disconnected first (or this handler was cancelled): abort now
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    if task.cancelled():
        # A server stopping because its engine died disconnects its requests too: they get the
        # engine's error, however slowly the engine's death shows.
        if (stopped := await _stop_reason_within_grace(request)) is not None:
            raise stopped
        raise BadRequest("the client went away; its request was aborted", 499)
    return task.result()  # raises the work's own error (an engine that died names itself)


@router.api_route(**mount("info"))
async def info(request: Request) -> JSONResponse:
    m = _model(request)
    points = m.points()  # a vllm-static server lists only the points it declared
    served = m.info.with_fields(
        model_id=m.model_id,
        backend=m.backend,
        points=tuple(points),
        widths=m.info.widths_of(set(points)),
        bos_token_id=m.tokenizer.bos_token_id,  # the remote client's to_tokens(prepend_bos=True)
    )
    return JSONResponse(served.to_wire())


@router.api_route(**mount("stats"))
async def stats(request: Request) -> JSONResponse:
    """The workers' registry: live request entries and installed hooks (0 and 0 when idle)."""
    return JSONResponse(await _model(request).stats())


async def _plan(request: Request, kind: str) -> Plan:
    """The request's plan, its named dictionary features resolved against the served ones, its
    prompt tokenized (text bounded first, in a thread) and its sampling within vLLM's ranges."""
    m, limits = _model(request), _limits(request)
    plan = Plan.from_wire(kind, await _json(request), _resolver(request))
    check_text(limits, text_bytes(_texts(plan.prompt)), "the prompt")
    tokenize = m.admission.prompts if kind == CAPTURE else m.admission.prompt_ids
    if plan.sampling is not None:
        check_sampling(plan.sampling)
    return plan.with_prompt(await asyncio.to_thread(tokenize, plan.prompt))


@router.api_route(**mount(CAPTURE))
async def capture(request: Request) -> Response:
    """A capture plan: its rows by address, its reductions' outputs as `label|output`."""
    m, limits = _model(request), _limits(request)
    plan = await _plan(request, CAPTURE)
    plan = replace(plan, reductions=resolve_reductions(plan.reductions, served_saes(request)))
    lengths = [min(len(p), limits.max_model_len) for p in plan.prompt]  # longer: the model refuses
    size = capture_bytes(m.info.widths, _canonical(plan.captures), lengths)
    for r in plan.reductions:  # an address the model refuses is refused before any forward
        width = m.info.widths.get(next(iter(_canonical([r.address])), ""), 0)
        size += r.reducer.row_bytes(width) * (len(lengths) if r.last else sum(lengths))
    what = f"capturing {len(plan.captures)} addresses over {len(plan.prompt)} prompts"
    if plan.reductions:
        what += f" reduced by {', '.join(r.reducer.kind for r in plan.reductions)}"
    check_response(limits, size, what)
    outcome = await _unless_gone(request, m.execute(plan))
    return await _tensors(
        {**{str(a): t for a, t in outcome.cache.items()}, **flat(outcome.reduced)}
    )


@router.api_route(**mount(CAPTURE_GENERATION))
async def capture_generation(request: Request) -> Response:
    m, limits = _model(request), _limits(request)
    plan = await _plan(request, CAPTURE_GENERATION)
    assert plan.sampling is not None
    seq = min(len(plan.prompt) + plan.sampling.max_new_tokens - 1, limits.max_model_len)
    size = capture_bytes(m.info.widths, _canonical(plan.captures), [seq])
    check_response(limits, size, f"capturing {len(plan.captures)} addresses over {seq} tokens")
    outcome = await _unless_gone(request, m.execute(plan))
    meta = asdict(outcome.generation)
    return await _tensors({str(a): t for a, t in outcome.cache.items()}, meta)


@router.api_route(**mount(GENERATE))
async def generate(request: Request) -> JSONResponse:
    m, plan = _model(request), await _plan(request, GENERATE)
    outcome = await _unless_gone(request, m.execute(plan))
    return JSONResponse(asdict(outcome.generation))


@router.api_route(**mount("generate_stream"))
async def generate_stream(request: Request) -> Response:
    """Newline-delimited JSON: one `{"token_id", "text"}` per token; an error ends the stream."""
    m, plan = _model(request), await _plan(request, GENERATE)
    if plan.reductions:
        raise BadRequest(
            "generate_stream carries no reductions over HTTP (their lines are tokens only); "
            "stream the read-out on the server's own backend"
        )
    stream = m.generate_stream(plan.prompt, plan.sampling, steering=plan.steering, lora=plan.lora)
    first = await anext(stream)  # validation errors surface here, before any 200

    async def lines() -> AsyncIterator[bytes]:
        try:
            yield _chunk_line(first)
            async for chunk in stream:
                yield _chunk_line(chunk)
        except Exception as exc:  # the 200 is sent: the error is the stream's last line
            yield (json.dumps(error_body(exc)) + "\n").encode()
        finally:
            await stream.aclose()

    return StreamingResponse(lines(), media_type="application/x-ndjson")


def _chunk_line(chunk: StreamChunk) -> bytes:
    """One token's line, as it was before chunks carried reductions: this route's plan reduces
    nothing, and `reduced` stays off the line."""
    body = asdict(replace(chunk, reduced={}))
    del body["reduced"]
    return (json.dumps(body) + "\n").encode()


def _vocab(m: Any) -> int:
    return m.info.vocab_size or len(m.tokenizer)


async def _decode_plan(
    request: Request, d_model: int, reductions: Sequence[Reduction] = ()
) -> Plan:
    """A decode plan: the body's residual rows (a safetensors payload holding `rows`)."""
    return Plan(DECODE, await _rows(request, d_model), reductions=tuple(reductions))


@router.api_route(**mount(DECODE))
async def decode_residuals(request: Request) -> Response:
    m = _model(request)
    plan = await _decode_plan(request, m.d_model)
    n_rows = plan.prompt.numel() // m.d_model
    check_response(_limits(request), n_rows * _vocab(m) * 4, f"logits for {n_rows} rows")
    outcome = await _unless_gone(request, m.execute(plan))
    return await _tensors(dict(outcome.reduced[DECODE]))


@router.api_route(**mount("lens_topk"))
async def lens_topk(request: Request) -> Response:
    m = _model(request)
    raw_k = request.query_params.get("k", "10")
    if not raw_k.isascii() or not raw_k.isdigit() or int(raw_k) < 1:
        raise BadRequest(f"k must be a positive integer, got {raw_k[:40]!r}")
    vocab = _vocab(m)
    if int(raw_k) > vocab:
        raise BadRequest(f"k={raw_k} is more than the vocabulary's {vocab} tokens")
    k = int(raw_k)
    plan = await _decode_plan(request, m.d_model, [Reduction("", LensTopK(k), "lens")])
    n_rows = plan.prompt.numel() // m.d_model
    check_response(_limits(request), n_rows * k * 12, f"top-{k} ids and probabilities")
    outcome = await _unless_gone(request, m.execute(plan))
    return await _tensors(dict(outcome.reduced["lens"]))


__all__ = ["RefusingRoute", "capture", "mount", "router", "served_saes"]
