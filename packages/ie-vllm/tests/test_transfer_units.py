"""The worker's per-step tensors without blocking copies (issue 44), checked on the CPU: the
helpers are the plain copies there, the step's position mask is only built where a row is
masked, reducers keep what they build from their params, and a payload decodes as before."""

from __future__ import annotations

import torch
from ie_core.experiments.probes import Probe
from ie_core.reduce import ProbeScores, TokenLogits
from ie_core.steer_scope import ScopedPositions
from ie_vllm import payload
from ie_vllm.specs import ReducerSpec
from ie_vllm.worker import reducers
from ie_vllm.worker.extension import _keep_mask
from ie_vllm.worker.layout import RequestRows
from ie_vllm.worker.transfer import Landing, to_device, to_host


def test_off_cuda_the_helpers_are_the_plain_copies() -> None:
    t = torch.arange(6.0)
    assert to_device(t, "cpu") is t
    copied = to_host(t)
    assert torch.equal(copied, t) and copied.data_ptr() != t.data_ptr()
    assert to_host(t, copy=False) is t
    landing = Landing()
    landing.record("cpu")
    assert landing.event is None
    landing.wait()


def test_the_keep_mask_exists_only_where_a_row_is_masked() -> None:
    rows = RequestRows("r", "k", 0, 4, 3)  # positions 3..6
    assert _keep_mask(frozenset({0, 1}), rows, torch.device("cpu")) is None
    got = _keep_mask(frozenset({4, 6}), rows, torch.device("cpu"))
    assert got is not None and got.tolist() == [True, False, True, False]
    # A prefill-only scope masks every position from its limit on, decode steps included.
    scoped = ScopedPositions({0}, limit=5)
    got = _keep_mask(scoped, rows, torch.device("cpu"))
    assert got is not None and got.tolist() == [True, True, False, False]
    decode = RequestRows("r", "k", 0, 1, 9)
    assert _keep_mask(frozenset({1}), decode, torch.device("cpu")) is None


def test_token_ids_and_probes_are_built_once() -> None:
    """Equal reducers of many requests (a sweep's cells) share the worker's kept instance, and
    with it the tensors it built on the device; a wire copy finds the same instance."""
    from ie_core.ops.vectors import CACHE_ATTR

    vocab = 11
    reducers.use_lens(lambda h: h[..., :vocab].float())
    spec = reducers.kept(ReducerSpec("m", "resid_post.0", TokenLogits((3, 5)), position=0))
    rows = torch.randn(2, 16)
    a = reducers.run([(spec, (0, rows))])[0]
    (ids,) = vars(spec.reducer)[CACHE_ATTR].values()
    again = reducers.kept(ReducerSpec.from_wire(spec.to_wire()))
    assert again.reducer is spec.reducer
    b = reducers.run([(again, (0, rows))])[0]
    assert next(iter(vars(again.reducer)[CACHE_ATTR].values())) is ids
    assert torch.equal(a["selected"], rows[:, [3, 5]]) and torch.equal(a["selected"], b["selected"])
    probe = Probe(tuple((1.0,) for _ in range(16)), (0.5,), "linear", vector=True)
    first_spec = reducers.kept(ReducerSpec("p", "resid_post.0", ProbeScores(probe)))
    first = reducers.run([(first_spec, (0, rows))])[0]["scores"]
    kept = dict(vars(first_spec.reducer.probe)[CACHE_ATTR])
    second_spec = reducers.kept(ReducerSpec.from_wire(first_spec.to_wire()))
    assert second_spec.reducer is first_spec.reducer
    second = reducers.run([(second_spec, (0, rows))])[0]["scores"]
    assert vars(second_spec.reducer.probe)[CACHE_ATTR] == kept
    assert torch.equal(first, second)
    assert torch.allclose(first, rows.sum(-1) + 0.5)


def test_a_payload_with_an_empty_host_part_decodes() -> None:
    parts = {"a": torch.empty(0), "b": torch.arange(5, dtype=torch.int64), "c": torch.ones(3, 2)}
    got = payload.decode(payload.encode(parts))
    assert got.keys() == parts.keys()
    for name, t in parts.items():
        assert torch.equal(got[name], t)
