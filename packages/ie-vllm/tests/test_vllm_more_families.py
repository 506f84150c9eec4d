"""Parity on one family per structural group of the families added to hooked vLLM.

gpt-neox: parallel block, per-head interleaved fused qkv, layernorm with bias, vLLM's Transformers
backend; olmo2: post-norm sandwich with no pre-MLP norm (resid_mid at the MLP input); bloom: ALiBi
in the recomputed scores, vLLM's modules that HF makes add the residual; granite: embedding,
residual and attention multipliers; gpt-bigcode: multi-query fused c_attn. The checks are those of
test_vllm_families (every served point equals eager within 1e-4, greedy tokens and lens, two
masked specs at one site with a merged-mask negative control), plus each family's refusals.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from ie_core.errors import PointUnavailableError
from test_vllm_families import (
    COMMON,
    test_every_servable_point_matches_eager,
    test_greedy_tokens_and_lens_match_eager,
    test_two_specs_at_one_site_keep_their_own_masks,
)
from vllm_parity import align_eager
from vllm_support import eager, requires_vllm, start, stop

pytestmark = [pytest.mark.slow, requires_vllm]

ATTN_MAPS = {"attn_scores", "attn_probs"}
QK_NORMS = {"q_norm_in", "q_norm_out", "k_norm_in", "k_norm_out"}
# Points each family must serve on vLLM, and (point, words of its refusal) it must refuse.
SERVED = {
    "gpt-neox": (COMMON - ATTN_MAPS - {"resid_mid"}) | {"mlp_act"},
    "olmo2": (COMMON - ATTN_MAPS) | QK_NORMS | {"mlp_act"},
    "bloom": COMMON | {"mlp_act"},
    "granite": COMMON | {"mlp_act"},
    "gpt-bigcode": (COMMON - ATTN_MAPS) | {"mlp_act"},
}
REFUSED = {
    "gpt-neox": [("resid_mid.0", "parallel"), ("attn_probs.1", "Transformers modeling backend")],
    "olmo2": [("attn_scores.0", "Transformers modeling backend")],
    "bloom": [("q_norm_in.0", "qk norm")],
    "granite": [("mlp_pre.0", "unreachable")],
    "gpt-bigcode": [("attn_scores.2", "Transformers modeling backend")],
}


# CI starts gpt-neox (Transformers backend, parallel block); the other four are long form only
# (IE_FULL_SUITE=1).
CI_FAMILIES = {"gpt-neox"}
FAMILIES = [
    f if f in CI_FAMILIES else pytest.param(f, marks=pytest.mark.full) for f in sorted(SERVED)
]


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[str, Any, Any]]:
    model_id = f"ie-synthetic/{request.param}"
    ref = eager(model_id)
    align_eager(request.param, ref)  # BLOOM: vLLM's exact GELU (vllm_parity.ENGINE_DIFFERENCES)
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


__all__ = [
    "test_every_servable_point_matches_eager",
    "test_greedy_tokens_and_lens_match_eager",
    "test_two_specs_at_one_site_keep_their_own_masks",
]
