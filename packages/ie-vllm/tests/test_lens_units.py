"""#18 lens toolkit pieces of ie-vllm that need no engine: the prefill-only scope on the wire and
in the worker's masks, and the streaming read-out's refusals."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from ie_core.errors import UnsupportedOperationError
from ie_core.model_info import ModelInfo
from ie_core.ops import Additive
from ie_core.steer_scope import ScopedPositions, scoped
from ie_vllm.host.streamed import check_served
from ie_vllm.host.variant import variant_for
from ie_vllm.specs import RequestSpec, SteerSpec


def test_prefill_scope_survives_the_wire() -> None:
    spec = RequestSpec("k", (), (SteerSpec("resid_post.1", (Additive([1.0]),), (0,), 7),), 7)
    back = RequestSpec.from_wire(spec.to_wire())
    assert back == spec and back.steering[0].until == 7
    old = spec.to_wire()
    del old["steering"][0]["until"]  # a spec from before the field reads as unscoped
    assert RequestSpec.from_wire(old).steering[0].until is None


def test_worker_mask_keeps_generated_rows_out_only_when_scoped() -> None:
    masked = scoped((0,), 7)
    assert isinstance(masked, ScopedPositions)
    # The worker's positions are numpy ints (RequestRows.positions).
    keep = [p not in masked for p in np.arange(10, dtype=np.int64)]
    assert keep == [False] + [True] * 6 + [False] * 3
    plain = scoped((0,), None)
    assert type(plain) is frozenset and 8 not in plain


SHAPE = {"n_layers": 2, "d_model": 4}


@pytest.mark.parametrize(
    ("backend", "info", "match"),
    [
        ("vllm-static", {}, "vllm-static"),
        ("vllm-generate", {}, "vllm-generate"),
    ],
)
def test_streaming_read_out_refusals(backend: str, info: dict, match: str) -> None:
    with pytest.raises(UnsupportedOperationError, match=match):
        model = SimpleNamespace(
            variant=variant_for(backend), info=ModelInfo.from_wire({**SHAPE, **info})
        )
        check_served(model)  # type: ignore[arg-type]
