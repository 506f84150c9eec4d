"""Streaming lens read-out: each generated token with the lens top-k of the rows computed since
the previous one (the first token carries the prompt's rows, token i the row of token i-1), as
`capture_generation_stream` cuts rows. The backend computes the read-out where the rows are (on
vLLM in the worker, so no residual row crosses to the host); with a Jacobian lens each
`resid_post.L` row is first carried by J_L."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ie_core.active_steering import with_active
from ie_core.embedded import lowered
from ie_core.errors import PointUnavailableError
from ie_core.experiments.jacobian_lens import JacobianLens
from ie_core.grammar import AddressLike, to_address
from ie_core.protocol import SamplingParams, SteeringArg, StreamChunk, TopK, steering_tuple
from ie_core.reduce import LensTopK
from ie_core.runner import iterate
from ie_core.sync import unwrap

__all__ = ["LensStep", "lens_transports", "stream_lens"]


@dataclass(frozen=True)
class LensStep:
    """One generated token and, per address, TopK(ids, probs) `[new rows, k]` of its new rows."""

    chunk: StreamChunk
    topk: Mapping[str, TopK]


def lens_transports(
    model: Any, addresses: Sequence[AddressLike], lens: JacobianLens | None
) -> dict[str, Any]:
    """Per address, the matrix its rows are carried by (none without a lens). A Jacobian lens
    reads `resid_post.L` rows at layers it was computed for; anything else is refused here."""
    if lens is None:
        return {}
    lens.check_model(model)
    out = {}
    for a in addresses:
        addr = to_address(a, check=True)
        if addr.name != "resid_post" or addr.layer is None:
            raise PointUnavailableError(
                f"{addr}: the Jacobian lens carries resid_post.L rows (d resid_final / "
                "d resid_post.L); stream resid_post addresses or drop the lens"
            )
        out[str(addr)] = lens.matrix(addr.layer).contiguous()
    return out


def stream_lens(
    model: Any,
    prompt: Any,
    addresses: Sequence[AddressLike],
    *,
    k: int = 5,
    lens: JacobianLens | None = None,
    steering: SteeringArg = None,
    max_new_tokens: int = 16,
    **sampling: Any,
) -> Iterator[LensStep]:
    """Generate, yielding each token with the lens top-k of its new rows at every address."""
    if isinstance(addresses, str):
        addresses = [addresses]
    LensTopK(k)  # a positive k, checked before any request
    model, steering = unwrap(model), with_active(model, steering)
    prompt, write = lowered(prompt)  # an embedded prompt: its ids, its vectors written first
    if write is not None:
        steering = (write, *steering_tuple(steering))
    params = SamplingParams(max_new_tokens=max_new_tokens, **sampling)
    transports = lens_transports(model, addresses, lens)
    agen = model.lens_generation_stream(
        prompt, list(addresses), params, k=k, transports=transports, steering=steering
    )
    yield from iterate(agen)
