"""The worker lifecycle (`ie_vllm.worker.lifecycle`) over hooked vLLM's `Hooks`, without an engine:
a real module carries the site's hook, and the runner is the few fields `record_layout` and
`carried` read (as test_vllm_units' layout tests). The engine versions: test_vllm_lifecycle.py
(hooked) and ie-static's test_static_outputs.py (the same lifecycle over `Slots`)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from ie_core.ops import Additive
from ie_vllm import payload
from ie_vllm.specs import RequestSpec, SteerSpec
from ie_vllm.worker.extension import Hooks, WorkerState, _forward_with_layout
from ie_vllm.worker.layout import KEY_ARG, SPEC_ARG
from ie_vllm.worker.lifecycle import Lifecycle
from ie_vllm.worker.point_table import PointTable, SiteDef

SITE = "resid_post.0"


def _runner(requests: dict[str, tuple[str, str, int]]) -> Any:
    """A runner whose batch holds each request id's (key, carried spec, rows), prefill from 0."""
    ids = list(requests)
    lens = [n for _, _, n in requests.values()]
    qsl = np.zeros(len(ids) + 1, dtype=np.int32)
    qsl[1:] = np.cumsum(lens)
    params = {
        r: SimpleNamespace(
            sampling_params=SimpleNamespace(extra_args={KEY_ARG: key, SPEC_ARG: spec})
        )
        for r, (key, spec, _) in requests.items()
    }
    return SimpleNamespace(
        input_batch=SimpleNamespace(
            num_reqs=len(ids), req_ids=ids, num_computed_tokens_cpu=np.zeros(len(ids), np.int32)
        ),
        query_start_loc=SimpleNamespace(np=qsl),
        requests=params,
    )


def _worker() -> tuple[torch.nn.Linear, WorkerState, Lifecycle[Any]]:
    module = torch.nn.Linear(4, 4)
    site = SiteDef(SITE, module, "post", lambda a, k, o: o, lambda a, k, o, new: new, 4)
    table = PointTable(n_layers=1, d_model=4, sites={SITE: site}, addresses={SITE: SITE})
    state = WorkerState(table=table)
    return module, state, Lifecycle(Hooks(state), state.registry)


def test_carried_specs_register_steer_capture_drain_and_release_their_hooks() -> None:
    module, state, life = _worker()
    vec = (1.0, -2.0, 0.5, 3.0)
    captured = RequestSpec("ka", captures=(SITE,), prompt_len=3).to_json()
    steered = RequestSpec(
        "kb", captures=(SITE,), steering=(SteerSpec(SITE, (Additive(vec),)),), prompt_len=2
    ).to_json()
    runner = _runner({"a-1": ("ka", captured, 3), "b-1": ("kb", steered, 2)})
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = module(x)  # before any hook: the independent reference
        out = _forward_with_layout(runner, state, life, lambda: module(x))()
    assert sorted(life.keys.entries) == ["ka", "kb"] and module._forward_hooks
    assert torch.equal(out[:3], want[:3])  # the unsteered request's rows are untouched
    assert torch.allclose(out[3:], want[3:] + torch.tensor(vec), atol=1e-6)
    drained = life.drain([["ka", 3], ["kb", 2]])
    rows = payload.decode(drained["rows"])
    assert drained["refused"] == {}
    assert torch.equal(rows[f"ka/{SITE}"], want[:3])
    assert torch.allclose(rows[f"kb/{SITE}"], out[3:])
    assert not life.keys.entries and not module._forward_hooks and not state.counts[SITE]
    # A released key seen again in a later forward is never registered again.
    with torch.no_grad():
        _forward_with_layout(runner, state, life, lambda: module(x))()
    assert not life.keys.entries and not module._forward_hooks


def test_a_spec_the_worker_cannot_take_is_refused_at_collect_and_drain_with_why() -> None:
    module, state, life = _worker()
    runner = _runner({"a-1": ("ka", "{not json", 2), "b-1": ("kb", "{not json", 2)})
    with torch.no_grad():
        _forward_with_layout(runner, state, life, lambda: module(torch.zeros(4, 4)))()
    assert set(life.keys.refused) == {"ka", "kb"} and not life.keys.entries
    with pytest.raises(RuntimeError, match="could not register request ka: JSONDecodeError"):
        life.collect("ka")
    drained = life.drain([["kb", 2]])
    assert list(drained["refused"]) == ["kb"] and "JSONDecodeError" in drained["refused"]["kb"]
    assert not life.keys.refused and not module._forward_hooks
    assert life.collect("ka") == payload.encode({})  # released: nothing, and no second raise
