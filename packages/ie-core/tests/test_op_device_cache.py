"""Ops keep the tensors they build from their values (issue 44): built once per op, device and
dtype, not at every forward, with the same numbers; never pickled or copied with the op; and a
tensor built in inference mode never reaches an autograd graph."""

from __future__ import annotations

import copy
import pickle

import torch
from ie_core.experiments.probes import Probe
from ie_core.ops import (
    Additive,
    Conditional,
    FeatureClamp,
    LensSwap,
    Orthogonal,
    Patch,
    ProjectionCap,
    TranscoderClamp,
)
from ie_core.ops.apply import apply_ops
from ie_core.ops.vectors import CACHE_ATTR, unit

V = [0.5, -1.0, 2.0, 0.25]
W = [1.0, 0.0, -0.5, 3.0]


def _ops() -> list:
    return [
        Additive(V, 2.0),
        Orthogonal(V, 0.25),
        ProjectionCap(W, min=-0.5, max=0.5),
        LensSwap(V, W),
        Patch([V, W], (1, 2)),
        FeatureClamp(V, W, bias=0.1, value=2.0),
        Conditional(Additive(W), V, threshold=0.1),
    ]


def test_an_op_builds_its_tensors_once_and_reuses_them() -> None:
    h, pos = torch.randn(3, 4), torch.arange(3)
    for op in _ops():
        first = apply_ops(h, [op], None, pos)
        store = op.__dict__[CACHE_ATTR] if CACHE_ATTR in op.__dict__ else op.op.__dict__[CACHE_ATTR]
        kept = {k: id(t) for k, t in store.items()}
        assert kept, op.kind
        again = apply_ops(h, [op], None, pos)
        assert torch.equal(first, again)
        assert {k: id(t) for k, t in store.items()} == kept  # nothing rebuilt


def test_kept_tensors_equal_what_the_op_built_before() -> None:
    h = torch.randn(3, 4)
    op = Orthogonal(V, 0.0)
    op.apply(h, None)
    (u,) = op.__dict__[CACHE_ATTR].values()
    assert torch.equal(u, unit(V, h))


def test_pickles_and_copies_carry_no_tensors() -> None:
    for op in _ops():
        apply_ops(torch.randn(2, 4), [op], None, torch.arange(2))
        for other in (pickle.loads(pickle.dumps(op)), copy.deepcopy(op), copy.copy(op)):
            assert CACHE_ATTR not in other.__dict__
            assert other == op
    probe = Probe.build(torch.tensor([V, W]).T, [0.1, 0.2], width=4, point="resid_post.0")
    probe.scores(torch.randn(2, 4))
    assert CACHE_ATTR not in pickle.loads(pickle.dumps(probe)).__dict__


def test_inference_mode_tensors_stay_in_inference_mode() -> None:
    op = Orthogonal(V, 0.0)
    with torch.inference_mode():
        op.apply(torch.randn(2, 4), None)
    h = torch.randn(2, 4, requires_grad=True)
    op.apply(h, None).sum().backward()  # would raise on an inference tensor saved for backward
    assert h.grad is not None


def test_a_transcoder_clamps_judged_form_uses_the_ops_tensors() -> None:
    op = TranscoderClamp(V, W, read="mlp_in.0", value=1.5, positions=(1,))
    x, pos = torch.randn(3, 4), torch.arange(3)
    a = apply_ops(x, [op.judged(op.judge(x))], None, pos)
    kept = dict(op.__dict__[CACHE_ATTR])
    b = apply_ops(x, [op.judged(op.judge(x))], None, pos)
    assert torch.equal(a, b)
    assert {k for k in kept} >= {k for k in op.__dict__[CACHE_ATTR]}
    assert all(op.__dict__[CACHE_ATTR][k] is t for k, t in kept.items())
