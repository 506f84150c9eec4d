"""Copyable code per backend for one point on one architecture (or the refusal it would get)."""

from __future__ import annotations

from dataclasses import dataclass

from ie_dashboard.tables import PointRow
from ie_dashboard.views import BackendServing

SAMPLE_LAYER = 0
PROMPT = "The capital of France is"


@dataclass(frozen=True)
class Snippet:
    backend: str
    code: str
    runnable: bool  # False: the text explains a refusal instead of code


# On a multi-stream trunk these single-stream residual points need a stream coordinate.
STREAM_POINTS = frozenset({"resid_pre", "resid_mid", "resid_post"})


def address_for(
    point: PointRow, layer: int | None, multi_stream: bool = False, stream: int = 0
) -> str:
    if point.scope == "trunk":
        return point.name
    address = f"{point.name}.{SAMPLE_LAYER if layer is None else layer}"
    return f"{address}.stream-{stream}" if multi_stream and point.name in STREAM_POINTS else address


def _load(model: str, backend: str, point: PointRow, address: str) -> str:
    if backend == "vllm-static":
        writes = (
            f", static_writes=[{address!r}]" if point.role == "read_write" else ", static_writes=[]"
        )
        return f'model = load_model({model!r}, backend="vllm-static", static_points=[{address!r}]{writes})'
    return f"model = load_model({model!r}, backend={backend!r})"


def _code(model: str, backend: str, point: PointRow, address: str, writable: bool) -> str:
    lines = ["from ie_core import capture, load_model"]
    if writable:
        lines[0] = "from ie_core import Additive, capture, generate, load_model, steer, steer_at"
    lines += [_load(model, backend, point, address), ""]
    lines += [
        f"cache = capture(model, {PROMPT!r}, [{address!r}])",
        f"acts = cache[{address!r}]  # {point.width} wide",
    ]
    if writable:
        lines += [
            "",
            "# steer: add a vector at this point for everything inside the block",
            "vector = acts[0, -1]  # any vector of the point's width",
            f"with steer(model, steer_at({address!r}, Additive(vector, 4.0))):",
            f"    out = generate(model, {PROMPT!r}, max_new_tokens=16)",
        ]
    return "\n".join(lines)


def snippets(
    point: PointRow,
    serving: list[BackendServing],
    model: str,
    layer: int | None,
    multi_stream: bool = False,
    stream: int = 0,
) -> list[Snippet]:
    address = address_for(point, layer, multi_stream, stream)
    out = []
    for s in serving:
        if s.served:
            code = _code(model, s.backend, point, address, s.writable)
            out.append(Snippet(s.backend, code, True))
        else:
            what = "refused" if s.verified else "not verified"
            out.append(Snippet(s.backend, f"# {what} on {s.backend}: {s.reason}", False))
    return out
