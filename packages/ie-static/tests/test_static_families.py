"""vllm-static on synthetic families (compiled CPU engine) against the eager HF backend.

Four families chosen for what differs in vLLM's decoder layers: GPT-2 (layers return one tensor,
learned positions), Qwen3 (QK-norm), Gemma 2 (sandwich norms, softcaps, embedding scale) and
Mixtral (MoE block). One engine at a time, a short max_model_len to keep compile and KV small.
Tolerance: eager vs vLLM fp32, 1e-4 absolute on rows of norm ~1 (the project's cross-backend bound).
"""

from __future__ import annotations

import pytest
import torch
from ie_core.protocol import SamplingParams
from ie_core.runner import run
from ie_core.steering import Additive, Orthogonal, PositionMask, steer_at

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # engine start: compile on a busy CPU

FAMILIES = ["gpt2", "qwen3", "gemma2", "mixtral"]
TOL = 1e-4
PROMPT = [1, 17, 42, 99, 7, 250, 3, 64]


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request):
    from ie_core.loading import load_model

    model_id = f"ie-synthetic/{request.param}"
    eager = load_model(model_id, backend="eager")
    n = eager.n_layers
    reads = [f"resid_post.{i}" for i in range(n)] + ["resid_pre.1", "attn_out.1", "mlp_out.1"]
    writes = ["resid_post.1", "attn_out.1"]
    static = load_model(
        model_id,
        backend="vllm-static",
        static_points=reads,
        static_writes=writes,
        max_model_len=128,
    )
    yield request.param, static, eager, reads
    run(static.shutdown())


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a.float() - b.float()).abs().max())


def test_capture_and_steering_equal_eager(pair) -> None:
    family, static, eager, reads = pair
    got = run(static.capture(PROMPT, reads))
    want = run(eager.capture([PROMPT], reads))
    diffs = {a: _diff(got[a], want[a]) for a in reads}
    assert max(diffs.values()) <= TOL, (family, diffs)
    # Negative control: resid_pre.1 is resid_post.0, not resid_post.1.
    assert _diff(got["resid_pre.1"], want["resid_post.1"]) > 1e-2

    width = static.d_model
    g = torch.Generator().manual_seed(3)
    specs = [
        steer_at("resid_post.1", Additive(torch.randn(width, generator=g), 2.0),
                 mask=PositionMask((0,))),
        steer_at("attn_out.1", Orthogonal(torch.randn(width, generator=g), 0.0)),
    ]  # fmt: skip
    sp = SamplingParams(max_new_tokens=4, stop_at_eos=False)
    last = f"resid_post.{static.n_layers - 1}"
    got_s = run(static.capture_generation(PROMPT, ["resid_post.1", last], sp, steering=specs))
    want_s = run(eager.capture_generation(PROMPT, ["resid_post.1", last], sp, steering=specs))
    assert got_s.generation.token_ids == want_s.generation.token_ids
    for a in ("resid_post.1", last):
        assert _diff(got_s.cache[a], want_s.cache[a]) <= TOL, (family, a)
    assert _diff(got_s.cache[last][:, : len(PROMPT)], want[last]) > 1e-3
