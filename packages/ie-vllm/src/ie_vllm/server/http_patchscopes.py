"""`POST /v1/ie/patchscope`: a source prompt's hidden state read as text at one or every layer
(`ie_core.experiments.patchscopes`: Patchscopes' presets, SelfIE's prompt, or a target of the
caller's), every read in flight at once on the served engine. The answer is
`{"reads": [{"layer", "target_layer", "token_ids", "text"}, ...]}`.

The reads are the same generate plans the `remote` backend sends one by one; this route saves
the round trips. A bad field, a source text over the server's limits or a layer the model lacks
is a 4xx with the reason, before any forward.
"""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from ie_core.experiments.patchscopes import read_patchscopes, reads_from_wire
from ie_core.wire import PREFIX

from ie_vllm.server.http_limits import check_sampling, check_text, text_bytes
from ie_vllm.server.http_routes import (
    RefusingRoute,
    _json,
    _limits,
    _model,
    _texts,
    _unless_gone,
    mount,
)

patchscope_router = APIRouter(prefix=PREFIX, route_class=RefusingRoute)


@patchscope_router.api_route(**mount("patchscope"))
async def patchscope(request: Request) -> JSONResponse:
    m, limits = _model(request), _limits(request)
    ask = reads_from_wire(await _json(request))
    check_text(limits, text_bytes(_texts([ask["source"]])), "the source prompt")
    check_sampling(ask["sampling"])
    reads = await _unless_gone(request, read_patchscopes(m, **ask))
    return JSONResponse({"reads": [asdict(r) for r in reads]})


__all__ = ["patchscope_router"]
