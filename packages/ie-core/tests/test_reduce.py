"""`ie_core.reduce` without a model: each reducer's outputs against an independent computation,
its wire form read back equal, a plan carrying reductions through its JSON, and the host fallback
shaping a batch as the workers' results are shaped."""

from __future__ import annotations

import pytest
import torch
from ie_core.errors import BadPromptError, SteeringSpecError
from ie_core.experiments.probes import Probe
from ie_core.experiments.sae_math import DictMeta, encode
from ie_core.plan import CAPTURE, Plan, PlanWireError
from ie_core.reduce import (
    REDUCER_KINDS,
    AtlasTopK,
    Cast,
    Context,
    DictionaryFeatures,
    LensTopK,
    ProbeScores,
    Reduction,
    TokenLogits,
    flat,
    nested,
    per_prompt,
    reduce_cache,
    reducer_from_dict,
)

WIDTH, VOCAB = 8, 11
G = torch.Generator().manual_seed(0)
UNEMBED = torch.randn(WIDTH, VOCAB, generator=G, dtype=torch.float64)
ROWS = torch.randn(5, WIDTH, generator=G)
DICT = {"W_enc": torch.randn(WIDTH, 20, generator=G), "b_enc": torch.randn(20, generator=G),
        "W_dec": torch.randn(20, WIDTH, generator=G), "b_dec": torch.randn(WIDTH, generator=G)}  # fmt: skip
META = DictMeta("relu")
CONTEXT = Context(lens=lambda h: (h.double() @ UNEMBED).float(),
                  dictionaries=lambda key: (DICT, META))  # fmt: skip


def _probe() -> Probe:
    return Probe.build(torch.arange(WIDTH * 2.0).reshape(WIDTH, 2) / 10, [0.5, -0.5], "tanh",
                       width=WIDTH, point="resid_post.1")  # fmt: skip


def test_each_reducer_equals_an_independent_computation() -> None:
    logits = ROWS.double() @ UNEMBED  # fp64 reference
    got = TokenLogits((3, 7)).apply(ROWS, CONTEXT)
    torch.testing.assert_close(got["selected"].double(), logits[:, [3, 7]], rtol=0, atol=1e-5)
    torch.testing.assert_close(got["lse"].double(), logits.logsumexp(-1), rtol=0, atol=1e-5)
    top = LensTopK(3).apply(ROWS, CONTEXT)
    want = logits.softmax(-1).topk(3, dim=-1)
    assert torch.equal(top["ids"], want.indices)
    torch.testing.assert_close(top["probs"].double(), want.values, rtol=0, atol=1e-6)
    w = torch.arange(WIDTH * 2.0).reshape(WIDTH, 2).double() / 10
    scores = ProbeScores(_probe()).apply(ROWS, CONTEXT)["scores"]
    want_scores = torch.tanh(ROWS.double() @ w + torch.tensor([0.5, -0.5], dtype=torch.float64))
    torch.testing.assert_close(scores.double(), want_scores, rtol=0, atol=1e-5)
    acts = DictionaryFeatures("key").apply(ROWS, CONTEXT)["acts"]
    torch.testing.assert_close(acts, encode(ROWS, DICT, META))
    k3 = DictionaryFeatures("key", k=3).apply(ROWS, CONTEXT)
    assert torch.equal(k3["values"], encode(ROWS, DICT, META).topk(3, dim=-1).values)
    assert Cast("bfloat16").apply(ROWS, CONTEXT)["rows"].dtype == torch.bfloat16
    # a control: another token's logits differ
    assert not torch.allclose(got["selected"][:, 0], got["selected"][:, 1])


def test_every_kind_reads_back_equal_from_its_wire_form() -> None:
    reducers = [TokenLogits((1, 2)), LensTopK(4), ProbeScores(_probe()),
                DictionaryFeatures("abc", 5, True), Cast("float16"),
                AtlasTopK("abc", 3, 2, (2, -4, 4), 1)]  # fmt: skip
    assert {type(r) for r in reducers} == set(REDUCER_KINDS.values())
    for r in reducers:
        assert reducer_from_dict(r.to_wire()) == r
    with pytest.raises(ValueError, match="unknown reducer"):
        reducer_from_dict({"kind": "nope"})
    with pytest.raises(SteeringSpecError, match="numbers"):
        reducer_from_dict({**ProbeScores(_probe()).to_wire(), "weight": "abc"})


def test_a_plan_carries_its_reductions_through_json() -> None:
    reductions = (Reduction("resid_post.1", ProbeScores(_probe()), "p"),
                  Reduction("resid_post.3", TokenLogits((5,)), "t", last=True))  # fmt: skip
    plan = Plan.of(CAPTURE, [[1, 2, 3]], (), None, reductions=reductions)
    assert Plan.from_wire(CAPTURE, plan.to_wire()) == plan
    with pytest.raises(PlanWireError, match="is a list"):
        Plan.from_wire(CAPTURE, {**plan.to_wire(), "reductions": "x"})
    with pytest.raises(PlanWireError, match="lacks the field"):
        Plan.from_wire(CAPTURE, {**plan.to_wire(), "reductions": [{"label": "x"}]})
    with pytest.raises(ValueError, match="labels must differ"):
        Plan.of(CAPTURE, [[1]], (), None, reductions=(reductions[0], reductions[0]))


def test_row_bytes_bound_what_a_server_returns() -> None:
    """Bytes per row of each result, as a server bounds its response: the outputs' own sizes."""
    rows = ROWS[:1]
    for reducer in (TokenLogits((1, 2)), LensTopK(4), ProbeScores(_probe()), Cast("bfloat16"),
                    DictionaryFeatures("key", 5, True)):  # fmt: skip
        got = reducer.apply(rows, CONTEXT)
        size = sum(t.numel() * t.element_size() for t in got.values())
        assert reducer.row_bytes(WIDTH) == size, type(reducer).__name__
    assert Cast("bfloat16").row_bytes(WIDTH) == 2 * WIDTH  # a cast's rows scale with the width


def test_checks_refuse_before_any_forward() -> None:
    with pytest.raises(BadPromptError, match="vocabulary"):
        TokenLogits((VOCAB,)).check(WIDTH, "resid_post.1", VOCAB)
    with pytest.raises(SteeringSpecError, match="wide"):
        ProbeScores(_probe()).check(WIDTH + 1, "resid_post.1", VOCAB)
    ProbeScores(_probe()).check(WIDTH, "resid_post.1", VOCAB)


def test_the_host_fallback_shapes_a_batch_as_the_workers_results() -> None:
    rows = torch.randn(2, 4, WIDTH, generator=G)
    reductions = [Reduction("a", DictionaryFeatures("key", k=2), "f"),
                  Reduction("a", TokenLogits((1,)), "t", last=True)]  # fmt: skip
    got = reduce_cache({"a": rows}, reductions, CONTEXT)
    assert got["f"]["ids"].shape == (2, 4, 2) and got["t"]["selected"].shape == (2, 1)
    # per prompt, as a worker returns them: all rows, or the last row only
    results = [flat(reduce_cache({"a": rows[b : b + 1]}, reductions, CONTEXT)) for b in range(2)]
    results = [{n: t[0] if n.startswith("f|") else t for n, t in r.items()} for r in results]
    joined = per_prompt(reductions, results)
    for label in ("f", "t"):
        for name, t in got[label].items():
            torch.testing.assert_close(joined[label][name], t)
    assert nested(flat(got), reductions)["t"].keys() == {"selected", "lse"}


def test_lens_topk_carries_rows_by_its_transport_first() -> None:
    """A Jacobian lens's transport J: the read-out is the lens of rows @ J.T (the lens here the
    identity, so logits are the carried rows); the transport stays off the wire."""
    from ie_core.reduce import Context, LensTopK

    g = torch.Generator().manual_seed(0)
    rows, j = torch.randn(4, 8, generator=g), torch.randn(8, 8, generator=g)
    carried = LensTopK(3, j)
    got = carried.apply(rows, Context(lens=lambda r: r))
    want = (rows @ j.T).topk(3, dim=-1)
    assert torch.equal(got["ids"], want.indices)
    lse = (rows @ j.T).logsumexp(dim=-1, keepdim=True)
    assert (got["probs"] - (want.values - lse).exp()).abs().max() < 1e-6
    plain = LensTopK(3).apply(rows, Context(lens=lambda r: r))
    assert not torch.equal(plain["ids"], got["ids"])  # control: the transport changes the read-out
    assert carried == LensTopK(3) and carried.to_wire() == LensTopK(3).to_wire()
    assert not carried.portable() and LensTopK(3).portable()
