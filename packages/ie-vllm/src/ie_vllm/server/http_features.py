"""The dictionary routes of `ie serve`: `GET /v1/ie/saes` lists the dictionaries named at
start-up (`--sae NAME=SOURCE`), `POST /v1/ie/features` reads features by name (the encode and
the top-k run in the worker; the answer is safetensors `NAME|ids`, `NAME|values`, or `NAME|acts`,
plus `NAME|sq_error` / `NAME|sq_norm` with stats), and `POST /v1/ie/feature_op` turns a named
feature op into the plain op's JSON (what the remote backend steers with). `POST
/v1/ie/probe_scores` scores a linear probe in the worker: only the scores (`scores`) come back.

A name the server does not serve, a feature outside the dictionary or a dictionary whose point
this server cannot read is a 4xx with the reason, before any forward runs.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from ie_core.wire import PREFIX

from ie_vllm.server.http_errors import BadRequest
from ie_vllm.server.http_limits import check_response
from ie_vllm.server.http_routes import (
    RefusingRoute,
    _batch,
    _json,
    _limits,
    _model,
    _steering,
    _tensors,
    _unless_gone,
    mount,
    served_saes,
)
from ie_vllm.server.served_saes import NAMED_KINDS, describe, named_op, served

features_router = APIRouter(prefix=PREFIX, route_class=RefusingRoute)


def _k(data: dict[str, Any], d_sae: int) -> int | None:
    k = data.get("k")
    if k is None:
        return None
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= d_sae:
        raise BadRequest(f"k must be an integer from 1 to the dictionary's {d_sae}, got {k!r:.40}")
    return k


@features_router.api_route(**mount("saes"))
async def saes(request: Request) -> JSONResponse:
    return JSONResponse(describe(served_saes(request)))


@features_router.api_route(**mount("features"))
async def features(request: Request) -> Response:
    m, data, limits = _model(request), await _json(request), _limits(request)
    names = data.get("saes")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise BadRequest("'saes' must be a non-empty list of served dictionary names")
    chosen = {n: served(served_saes(request), n) for n in dict.fromkeys(names)}
    widest = max(s.d_sae for s in chosen.values())
    k, stats = _k(data, min(s.d_sae for s in chosen.values())), data.get("stats", False)
    if not isinstance(stats, bool):
        raise BadRequest("'stats' must be true or false")
    prompts = await _batch(m, limits, data.get("prompts"))
    tokens = sum(min(len(p), limits.max_model_len) for p in prompts)
    per_token = (12 * k if k is not None else 4 * widest) + (8 if stats else 0)
    check_response(limits, tokens * per_token * len(chosen), f"features over {tokens} tokens")
    steering = _steering(request, data)
    work = m.dictionary_features(prompts, chosen, k=k, stats=stats, steering=steering)
    out = await _unless_gone(request, work)
    return await _tensors({f"{n}|{o}": t for n, got in out.items() for o, t in got.items()})


@features_router.api_route(**mount("probe_scores"))
async def probe_scores(request: Request) -> Response:
    m, data, limits = _model(request), await _json(request), _limits(request)
    address = data.get("address")
    activation = data.get("activation", "linear")
    if not isinstance(address, str) or not isinstance(activation, str):
        raise BadRequest("'address' and 'activation' must be strings")
    prompts = await _batch(m, limits, data.get("prompts"))
    weight = data.get("weight")
    outputs = (
        len(weight[0]) if isinstance(weight, list) and weight and isinstance(weight[0], list) else 1
    )
    tokens = sum(min(len(p), limits.max_model_len) for p in prompts)
    check_response(limits, tokens * outputs * 4, f"probe scores over {tokens} tokens")
    work = m.probe_scores(prompts, address, weight, bias=data.get("bias", 0.0),
                          activation=activation, steering=_steering(request, data))  # fmt: skip
    return await _tensors({"scores": await _unless_gone(request, work)})


@features_router.api_route(**mount("feature_op"))
async def feature_op(request: Request) -> JSONResponse:
    data = await _json(request)
    if data.get("kind") not in NAMED_KINDS:
        raise BadRequest(f"'kind' must be one of {', '.join(NAMED_KINDS)}")
    return JSONResponse(named_op(data, served_saes(request)))


__all__ = ["features_router"]
