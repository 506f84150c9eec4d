"""The batch layout of one forward: which rows of vLLM's flat `[tokens, width]` batch belong to
which request, and at which sequence positions. `runner_adapter.record_layout` reads it off the
runner just before each forward."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from ie_core.wire import KEY_XARG, SPEC_XARG

# SamplingParams.extra_args entries the worker reads: the request's registry key, and its
# `RequestSpec` as JSON (the same names the HTTP server reserves).
KEY_ARG = KEY_XARG
SPEC_ARG = SPEC_XARG


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
