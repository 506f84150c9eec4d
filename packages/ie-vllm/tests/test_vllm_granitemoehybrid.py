"""Granite-4.0-H on hooked vLLM (CPU build) against eager: Mamba2 and attention layers, routed
experts plus a shared MLP summed inline, Granite multipliers.

vLLM's layers return `(stream, resid_mid)` and are called with keywords; the Mamba2 layers' mixer
is `mamba`, whose input and output are attn_in / attn_out there. mlp_out is read at the shared MLP
(it runs second) plus the routed output a companion hook kept (`ie_vllm.worker.access.BranchSum`). Every
served point equals eager within 1e-4 (fp32), steering the branch equals eager's, and a reader of
one MLP module alone (the wrong implementation) is off by far more than the tolerance.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from ie_core import Additive, Orthogonal, steer_at
from ie_core.errors import PointUnavailableError
from ie_core.runner import run
from test_vllm_families import (
    COMMON,
    test_every_servable_point_matches_eager,
    test_greedy_tokens_and_lens_match_eager,
)
from vllm_parity import PROMPT_TEXT
from vllm_support import eager, requires_vllm, start, stop

pytestmark = [pytest.mark.slow, requires_vllm]

MODEL = "ie-synthetic/granitemoehybrid"
TOL = 1e-4
ATTENTION_ONLY = ("value", "z", "attn_scores", "attn_probs")
MAMBA_LAYERS, ATTN_LAYERS = (0, 2), (1, 3)


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[str, Any, Any]]:
    ref = eager(MODEL)
    model = start(MODEL)
    yield "granitemoehybrid", model, ref
    stop(model)


def test_serves_the_hybrid_layers_and_refuses_what_they_lack(pair: tuple[str, Any, Any]) -> None:
    _, model, _ = pair
    assert COMMON | {"router_logits"} <= set(model.points())
    for layer in MAMBA_LAYERS:
        for name in ("attn_in", "attn_out", "attn_out_post", "mlp_out", "mlp_in"):
            assert model.point_width(f"{name}.{layer}") == model.d_model
        for name in ATTENTION_ONLY:
            with pytest.raises(PointUnavailableError, match="state-space layer"):
                model.point_width(f"{name}.{layer}")
    for layer in ATTN_LAYERS:
        assert model.point_width(f"value.{layer}") > 0
    for name in ("mlp_act.1", "q_norm_in.1", "expert_weights.0"):
        with pytest.raises(PointUnavailableError):
            model.point_width(name)


def _ids(ref: Any) -> list[int]:
    return ref.to_tokens(PROMPT_TEXT)


def test_mlp_out_is_neither_mlp_module_alone(pair: tuple[str, Any, Any]) -> None:
    """Negative control: what a one-module tap would read is far outside the parity tolerance."""
    _, model, ref = pair
    ids, layer = _ids(ref), 1
    got = run(model.capture([ids], [f"mlp_out.{layer}"]))[f"mlp_out.{layer}"][0]
    paths = [f"path.model.layers.{layer}.{n}" for n in ("shared_mlp", "block_sparse_moe")]
    _, alone = ref.forward_with_cache([ids], paths)
    for path in paths:
        assert (alone[path][0].float() - got.float()).abs().max() > 100 * TOL, path


@pytest.mark.parametrize("address", ["mlp_out.1", "mlp_out_post.2", "attn_out.0", "mlp_in.2"])
def test_steering_equals_eager(pair: tuple[str, Any, Any], address: str) -> None:
    """An additive and an ablating write (the ablation separates a write to the sum from one to
    the shared MLP alone) move every later point as eager's do."""
    _, model, ref = pair
    ids = _ids(ref)
    g = torch.Generator().manual_seed(1)
    v = torch.randn(model.d_model, generator=g)
    u = torch.randn(model.d_model, generator=g)
    specs = [steer_at(address, Additive(v, 2.0)), steer_at(address, Orthogonal(u / u.norm()))]
    reads = [address, "resid_post.2", "resid_post.3"]
    base = run(model.capture([ids], reads))
    for spec in specs:
        got = run(model.capture([ids], reads, steering=[spec]))
        want = run(ref.capture([ids], reads, steering=[spec]))
        for a in reads:
            assert (got[a][0].float() - want[a][0].float()).abs().max() <= TOL, (spec, a)
        assert (got["resid_post.3"][0] - base["resid_post.3"][0]).abs().max() > 100 * TOL


__all__ = [
    "test_every_servable_point_matches_eager",
    "test_greedy_tokens_and_lens_match_eager",
]
