"""Parity of every servable point, vLLM against eager, on synthetic families (fp32, CPU).

Families are chosen for the structure they exercise on vLLM's tree: llama (GQA, fused residual
add-norm), qwen3 (QK-norm), mixtral (MoE router), gemma2 (sandwich
norms, attention and logit softcaps, alternating window, embedding scale outside the module),
gemma3 (QK-norm + sandwich + embedding scale), gpt2 (layers without the residual pair, learned
positions). One engine per family, started once.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import torch
from ie_core import Additive, PositionMask, SamplingParams, steer_at
from ie_core.errors import PointUnavailableError
from ie_core.runner import run
from vllm_embedded_checks import embedded_generation_and_rows_match
from vllm_parity import PROMPT_TEXT, max_abs_diffs, servable_addresses
from vllm_support import eager, requires_vllm, start, stop

pytestmark = [pytest.mark.slow, requires_vllm]

TOL = 1e-4
# CI starts qwen3 (QK norm), mixtral (router) and gemma2 (sandwich norms, softcaps, window). Long
# form only: llama (SmolLM2 is one), gemma3 (qwen3 + gemma2) and gpt2 (unfused layers, which
# Granite-4.0-H and gpt-neox exercise in CI).
FAMILIES = [
    pytest.param("llama", marks=pytest.mark.full), "qwen3", "mixtral", "gemma2",
    pytest.param("gemma3", marks=pytest.mark.full), pytest.param("gpt2", marks=pytest.mark.full),
]  # fmt: skip
# Points each family must serve on vLLM (beyond the common residual / attention / MLP set).
EXPECTED_EXTRA = {
    "qwen3": {"q_norm_in", "q_norm_out", "k_norm_in", "k_norm_out"},
    "gemma3": {"q_norm_in", "q_norm_out", "k_norm_in", "k_norm_out"},
    "mixtral": {"router_logits"},
}
COMMON = {
    "embeddings", "resid_pre", "attn_in", "value", "attn_scores", "attn_probs", "z", "attn_out",
    "attn_out_post", "resid_mid", "mlp_in", "mlp_out", "mlp_out_post", "resid_post", "final_norm",
}  # fmt: skip


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[str, Any, Any]]:
    model_id = f"ie-synthetic/{request.param}"
    ref = eager(model_id)
    model = start(model_id)
    yield request.param, model, ref
    stop(model)


def test_family_serves_its_points(pair: tuple[str, Any, Any]) -> None:
    family, model, _ = pair
    names = set(model.points())
    want = COMMON | EXPECTED_EXTRA.get(family, set())
    if family != "mixtral":
        want |= {"mlp_act"}  # dense MLPs; mixtral's experts run in one fused kernel
    assert want <= names, want - names
    if family not in EXPECTED_EXTRA or "q_norm_in" not in EXPECTED_EXTRA[family]:
        with pytest.raises(PointUnavailableError, match="qk norm"):
            model.point_width("q_norm_in.0")


def test_every_servable_point_matches_eager(pair: tuple[str, Any, Any]) -> None:
    family, model, ref = pair
    ids = ref.to_tokens(PROMPT_TEXT)
    assert len(ids) > 8  # past the synthetic sliding window
    addresses = servable_addresses(model)
    got = run(model.capture([ids], addresses))
    want = run(ref.capture([ids], addresses))
    diffs = max_abs_diffs(got, want, addresses)
    worst = max(diffs, key=diffs.__getitem__)
    assert diffs[worst] <= TOL, f"{family} {worst}: {diffs[worst]}"


def test_greedy_tokens_and_lens_match_eager(pair: tuple[str, Any, Any]) -> None:
    family, model, ref = pair
    ids = ref.to_tokens("def add(a, b):")
    params = SamplingParams(max_new_tokens=4, stop_at_eos=False)
    assert run(model.generate(ids, params)).token_ids == run(ref.generate(ids, params)).token_ids
    last = f"resid_post.{model.n_layers - 1}"
    h = run(model.capture([ids], [last]))[last][0]
    got, want = run(model.decode_residuals_topk(h, 3)), run(ref.decode_residuals_topk(h, 3))
    assert (got.probs - want.probs).abs().max() <= TOL, family
    assert (run(model.decode_residuals(h)) - run(ref.decode_residuals(h))).abs().max() <= TOL


def test_two_specs_at_one_site_keep_their_own_masks(pair: tuple[str, Any, Any]) -> None:
    family, model, ref = pair
    ids = ref.to_tokens(PROMPT_TEXT)
    read = "resid_post.1"
    g = torch.Generator().manual_seed(0)
    v1, v2 = (torch.randn(model.d_model, generator=g) for _ in range(2))
    specs = [
        steer_at(read, Additive(v1, 2.0), mask=PositionMask((0, 1))),
        steer_at(read, Additive(v2, 3.0), mask=PositionMask((2, 3))),
    ]
    got = run(model.capture([ids], [read], steering=specs))[read]
    want = run(ref.capture([ids], [read], steering=specs))[read]
    assert (got - want).abs().max() <= TOL, family
    # Negative control: merging the two masks leaves positions 0-3 unsteered by both specs.
    merged = [replace(s, mask=PositionMask((0, 1, 2, 3))) for s in specs]
    wrong = run(ref.capture([ids], [read], steering=merged))[read]
    assert (wrong - want).abs().max() > 0.5, family


def test_generation_and_capture_from_embeddings_match_eager(pair: tuple[str, Any, Any]) -> None:
    _, model, ref = pair
    embedded_generation_and_rows_match(model, ref, TOL)
