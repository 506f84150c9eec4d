"""The dictionary routes of `ie serve`: `GET /v1/ie/saes` lists the dictionaries named at
start-up (`--sae NAME=SOURCE`) and `POST /v1/ie/feature_op` turns a named feature op into the
plain op's JSON (what the remote backend steers with). `POST /v1/ie/features` and `POST
/v1/ie/probe_scores` take a capture plan whose reductions (`ie_core.reduce`: a served dictionary
by name, a probe) run in the worker, as `/v1/ie/capture` does: only `LABEL|output` comes back
(`LABEL|ids`, `LABEL|values` or `LABEL|acts`, with stats `LABEL|sq_error` / `LABEL|sq_norm`; a
probe's `LABEL|scores`).

A name the server does not serve, a feature outside the dictionary or a dictionary whose point
this server cannot read is a 4xx with the reason, before any forward runs.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from ie_core.wire import PREFIX

from ie_vllm.server.http_errors import BadRequest
from ie_vllm.server.http_routes import (
    RefusingRoute,
    _json,
    capture,
    mount,
    served_saes,
)
from ie_vllm.server.served_saes import NAMED_KINDS, describe, named_op

features_router = APIRouter(prefix=PREFIX, route_class=RefusingRoute)


@features_router.api_route(**mount("saes"))
async def saes(request: Request) -> JSONResponse:
    return JSONResponse(describe(served_saes(request)))


# The read-outs reduced in the worker: a capture plan with reductions, as `/v1/ie/capture`.
features_router.api_route(**mount("features"))(capture)
features_router.api_route(**mount("probe_scores"))(capture)


@features_router.api_route(**mount("feature_op"))
async def feature_op(request: Request) -> JSONResponse:
    data = await _json(request)
    if data.get("kind") not in NAMED_KINDS:
        raise BadRequest(f"'kind' must be one of {', '.join(NAMED_KINDS)}")
    return JSONResponse(named_op(data, served_saes(request)))


__all__ = ["features_router"]
