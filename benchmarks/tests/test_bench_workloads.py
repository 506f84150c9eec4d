"""Workloads on a fake backend: each classifies ok / unsupported / error the way the report relies on."""

from __future__ import annotations

import pytest
from bench_fake_model import FakeModel
from ie_bench.prompts import normalized_prompts
from ie_bench.spec import WORKLOADS, get_profile
from ie_bench.workloads import Context, measure


def _ctx(model: FakeModel) -> Context:
    profile = get_profile("tiny")
    prompts = normalized_prompts(model, profile.prompt_tokens, profile.concurrency)
    return Context(model, profile, prompts, "resid_post", 2, model.n_layers, model.d_model)


def test_prompts_have_the_exact_length_and_differ() -> None:
    prompts = normalized_prompts(FakeModel(), 40, 8)
    assert {len(p) for p in prompts} == {40}
    assert len({tuple(p) for p in prompts}) == 8
    assert all(p[0] == 1 for p in prompts)  # BOS kept


@pytest.mark.parametrize("workload", [w.key for w in WORKLOADS])
async def test_every_workload_measures_on_a_capable_backend(workload: str) -> None:
    outcome = await measure(_ctx(FakeModel()), workload)
    assert outcome.status == "ok", outcome.detail
    spec = next(w for w in WORKLOADS if w.key == workload)
    assert spec.headline in outcome.metrics
    assert all(v > 0 for v in outcome.metrics.values())


async def test_generate_counts_exact_tokens_and_excludes_the_first_from_decode() -> None:
    ctx = _ctx(FakeModel())
    outcome = await measure(ctx, "generate")
    assert outcome.detail["new_tokens"] == ctx.profile.new_tokens
    assert outcome.metrics["decode_tok_s"] != pytest.approx(
        ctx.profile.new_tokens / outcome.metrics["total_s"], rel=1e-6
    )


async def test_refused_capture_is_unsupported_with_the_message() -> None:
    outcome = await measure(_ctx(FakeModel(refuse_capture=True)), "capture_mid")
    assert outcome.status == "unsupported"
    assert "cannot capture" in outcome.detail["message"]
    assert outcome.detail["error_type"] == "UnsupportedOperationError"


async def test_short_capture_is_unsupported_with_the_shape() -> None:
    outcome = await measure(_ctx(FakeModel(short_capture=True)), "capture_all")
    assert outcome.status == "unsupported"
    assert "expected 16 positions" in outcome.detail["what_came_back"]


async def test_ignored_steering_is_an_error() -> None:
    outcome = await measure(_ctx(FakeModel(ignore_steering=True)), "steer")
    assert outcome.status == "error"
    assert "no effect" in outcome.detail["message"]


async def test_steering_effect_is_the_coefficient() -> None:
    outcome = await measure(_ctx(FakeModel()), "steer")
    assert outcome.detail["check"]["effect_max_norm"] == pytest.approx(8.0, rel=1e-5)


async def test_wrong_topk_is_an_error() -> None:
    outcome = await measure(_ctx(FakeModel(wrong_topk=True)), "lens_topk")
    assert outcome.status == "error"
    assert "disagree with the full read-out" in outcome.detail["message"]
