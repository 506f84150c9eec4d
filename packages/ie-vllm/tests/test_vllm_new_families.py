"""Parity on the families added after v1 that vLLM 0.32 CPU runs: gpt-oss, glm4-moe, olmo3.

gpt-oss: vLLM-native, learned attention sinks (the recomputed probabilities include each head's
sink column, then drop it), alternating sliding window, MoE on every layer with a router named
`router`, and a decoder layer called as (hidden, positions, residual). glm4-moe: QK-norm, partial
rotary, dense layer 0 then sigmoid-routed MoE with a shared expert. olmo3: OLMo-2's post-norm
blocks on vLLM's Transformers backend. The checks are those of test_vllm_families (every served
point equals eager within 1e-4, greedy tokens and lens, two masked specs at one site with a
merged-mask negative control) plus each family's refusals.

CI starts one engine (gpt-oss, the layout the others do not already exercise). glm4-moe and olmo3
run with IE_FULL_SUITE=1; their committed answers come from `ie points --sweep`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from ie_core.errors import PointUnavailableError
from ie_core.runner import run
from test_vllm_families import (
    COMMON,
    test_every_servable_point_matches_eager,
    test_greedy_tokens_and_lens_match_eager,
    test_two_specs_at_one_site_keep_their_own_masks,
)
from vllm_parity import PROMPT_TEXT
from vllm_support import eager, requires_vllm, start, stop

pytestmark = [pytest.mark.slow, requires_vllm]

ATTN_MAPS = {"attn_scores", "attn_probs"}
QK_NORMS = {"q_norm_in", "q_norm_out", "k_norm_in", "k_norm_out"}
SERVED = {
    "gpt-oss": COMMON | {"router_logits"},
    "glm4-moe": COMMON | QK_NORMS | {"mlp_act", "router_logits"},
    "olmo3": (COMMON - ATTN_MAPS) | QK_NORMS | {"mlp_act"},
}
REFUSED = {
    "gpt-oss": [("mlp_act.0", "fused MoE kernel"), ("q_norm_in.0", "qk norm")],
    "glm4-moe": [("mlp_act.1", "fused MoE kernel"), ("router_logits.0", "dense MLP layer")],
    "olmo3": [("attn_probs.3", "Transformers modeling backend"), ("router_logits.0", "")],
}
FAMILIES = [
    f if f == "gpt-oss" else pytest.param(f, marks=pytest.mark.full) for f in sorted(SERVED)
]


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[str, Any, Any]]:
    model_id = f"ie-synthetic/{request.param}"
    ref = eager(model_id)
    model = start(model_id)
    yield request.param, model, ref
    stop(model)


def test_family_serves_and_refuses_its_points(pair: tuple[str, Any, Any]) -> None:
    family, model, _ = pair
    names = set(model.points())
    assert SERVED[family] <= names, SERVED[family] - names
    for address, words in REFUSED[family]:
        with pytest.raises(PointUnavailableError, match=words):
            model.point_width(address)


def test_sink_probabilities_do_not_sum_to_one(pair: tuple[str, Any, Any]) -> None:
    """gpt-oss: rows of attn_probs lose the sink's share; a plain softmax would sum to 1."""
    family, model, ref = pair
    if family != "gpt-oss":
        pytest.skip("no attention sinks")
    ids = ref.to_tokens(PROMPT_TEXT)
    got = run(model.capture([ids], ["attn_probs.1"]))["attn_probs.1"][0]
    want = run(ref.capture([ids], ["attn_probs.1"]))["attn_probs.1"][0]
    assert (got - want).abs().max() <= 1e-4
    sums = got.sum(-1)
    assert (sums < 1 - 1e-3).any(), "sink share missing from the probabilities"
    # Negative control: softmax of the served scores alone (no sink) is not what eager returns.
    scores = run(model.capture([ids], ["attn_scores.1"]))["attn_scores.1"][0]
    assert (torch.softmax(scores.float(), -1) - want).abs().max() > 1e-3


__all__ = [
    "test_every_servable_point_matches_eager",
    "test_greedy_tokens_and_lens_match_eager",
    "test_two_specs_at_one_site_keep_their_own_masks",
]
