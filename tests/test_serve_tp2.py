"""`ie serve ie-synthetic/llama --tensor-parallel-size 2` on the CPU build: two worker ranks.

Cost: one server with two CPU workers (about one engine start, ~2 min on a quiet 2-core machine).
The reference is eager on the same folder in-process (an independent engine, fp32): tensor
parallelism splits the matmuls and all-reduces the partial sums, so sums are reordered and the
tolerance is the cross-engine one, 1e-4 absolute (activations here are O(1)).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import torch

pytest.importorskip("vllm")

from ie_core import Additive, SamplingParams, load_model, steer_at
from ie_core.runner import run
from ie_core.wire import STEERING_XARG, steering_to_wire
from serve_process import ie_serve

pytestmark = [pytest.mark.slow]

MODEL = "ie-synthetic/llama"
TOL = 1e-4
PROMPT = "The quick brown fox jumps over the lazy dog"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("serve_tp2") / "server.log"
    args = ["--tensor-parallel-size", "2", "--max-model-len", "256"]
    with ie_serve(MODEL, [*args, "--disable-uvicorn-access-log"], log) as url:
        yield url


def test_tp2_capture_and_steering_over_http_equal_eager(server: str) -> None:
    remote = load_model(server, backend="remote")
    ref = load_model(MODEL, backend="eager", device="cpu", dtype="float32")
    ids = ref.to_tokens(PROMPT)
    residual = [f"{p}.{i}" for p in ("resid_post", "resid_pre") for i in range(ref.n_layers)]
    got = run(remote.capture([ids], residual))
    want = run(ref.capture([ids], residual))
    worst = max(float((got[a] - want[a]).abs().max()) for a in residual)
    print(f"TP=2 capture max-abs vs eager over {len(residual)} points: {worst:.2e}")
    assert worst <= TOL, worst

    vector = torch.randn(ref.d_model, generator=torch.Generator().manual_seed(3))
    spec = steer_at("resid_post.1", Additive(vector, 8.0))
    steered = run(remote.capture([ids], ["resid_post.3"], steering=spec))["resid_post.3"]
    expected = run(ref.capture([ids], ["resid_post.3"], steering=spec))["resid_post.3"]
    print(f"TP=2 steered capture max-abs vs eager: {float((steered - expected).abs().max()):.2e}")
    assert float((steered - expected).abs().max()) <= TOL
    assert float((steered - want["resid_post.3"]).abs().max()) > 100 * TOL  # negative control

    params = SamplingParams(max_new_tokens=6, stop_at_eos=False)
    want_ids = list(run(ref.generate(ids, params, steering=spec)).token_ids)
    assert list(run(remote.generate(ids, params, steering=spec)).token_ids) == want_ids
    body: dict[str, Any] = {
        "model": MODEL,
        "prompt": ids,
        "max_tokens": 6,
        "temperature": 0.0,
        "return_token_ids": True,
        "vllm_xargs": {STEERING_XARG: json.dumps(steering_to_wire(spec))},
    }
    out = httpx.post(f"{server}/v1/completions", json=body, timeout=300).json()
    assert out["choices"][0]["token_ids"] == want_ids
    plain = list(run(remote.generate(ids, params)).token_ids)
    assert plain == list(run(ref.generate(ids, params)).token_ids) and plain != want_ids

    # The lens on rows you pass: the unembed is split over both ranks and gathered.
    h = want[f"resid_post.{ref.n_layers - 1}"][0]
    got_top, want_top = (
        run(remote.decode_residuals_topk(h, 3)),
        run(ref.decode_residuals_topk(h, 3)),
    )
    assert torch.equal(got_top.ids, want_top.ids)
    assert float((got_top.probs - want_top.probs).abs().max()) <= TOL

    # Head- and neuron-sharded points are refused with a sentence at TP=2, never half a tensor.
    r = httpx.post(
        f"{server}/v1/ie/capture",
        json={"prompts": [ids], "addresses": ["mlp_act.1"]},
        timeout=120,
    )
    assert 400 <= r.status_code < 500, r.text
    print("TP=2 mlp_act refusal:", r.json()["error"]["message"])
    assert run(remote.stats())["registered"] == 0
