"""The batch layout of one forward: which rows of vLLM's flat `[tokens, width]` batch belong to
which request, and at which sequence positions. Recorded just before each forward."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

KEY_ARG = "ie_key"  # SamplingParams.extra_args entry naming the request in the worker registry


@dataclass(frozen=True)
class RequestRows:
    """Rows `[start, end)` of the batch hold positions `first_pos .. first_pos + end - start - 1`."""

    req_id: str  # vLLM's internal request id (the external id plus a suffix)
    key: str | None  # our registry key, None for requests nobody registered
    start: int
    end: int
    first_pos: int

    @property
    def n(self) -> int:
        return self.end - self.start

    def positions(self) -> np.ndarray:
        return np.arange(self.first_pos, self.first_pos + self.n, dtype=np.int64)


@dataclass(frozen=True)
class BatchLayout:
    rows: tuple[RequestRows, ...]
    num_tokens: int

    def keyed(self) -> tuple[RequestRows, ...]:
        return tuple(r for r in self.rows if r.key is not None)


def request_key(runner: Any, req_id: str) -> str | None:
    """Our key for a vLLM request: from its extra_args, else the id without vLLM's suffix."""
    state = runner.requests.get(req_id)
    params = getattr(state, "sampling_params", None)
    extra = getattr(params, "extra_args", None) or {}
    key = extra.get(KEY_ARG)
    return str(key) if key is not None else None


def record_layout(runner: Any) -> BatchLayout:
    """Read the layout the runner prepared for the forward it is about to run.

    `_prepare_inputs` has filled `query_start_loc` (cumulative rows per request, in
    `input_batch.req_ids` order) and positions are `num_computed_tokens + arange`.
    """
    batch = runner.input_batch
    num_reqs = int(batch.num_reqs)
    qsl = runner.query_start_loc.np[: num_reqs + 1]
    computed = batch.num_computed_tokens_cpu[:num_reqs]
    rows = []
    for i, req_id in enumerate(batch.req_ids[:num_reqs]):
        start, end = int(qsl[i]), int(qsl[i + 1])
        if end > start:
            rows.append(
                RequestRows(req_id, request_key(runner, req_id), start, end, int(computed[i]))
            )
    return BatchLayout(tuple(rows), int(qsl[num_reqs]) if num_reqs else 0)
