"""`ie serve ie-synthetic/llama --pipeline-parallel-size 2` on the CPU build: two stages.

Long form only (`IE_FULL_SUITE=1`): one server with two CPU workers, about one engine start; CI
covers the same host code in-process (packages/ie-vllm/tests/test_vllm_pipeline_parallel.py).
The reference is eager on the same folder in-process, at the cross-engine tolerance (1e-4
absolute; activations here are O(1)).
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

pytestmark = [pytest.mark.slow, pytest.mark.full]

MODEL = "ie-synthetic/llama"
TOL = 1e-4
PROMPT = "The quick brown fox jumps over the lazy dog"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("serve_pp2") / "server.log"
    args = ["--pipeline-parallel-size", "2", "--max-model-len", "256"]
    with ie_serve(MODEL, [*args, "--disable-uvicorn-access-log"], log) as url:
        yield url


def test_pp2_capture_and_steering_over_http_equal_eager(server: str) -> None:
    remote = load_model(server, backend="remote")
    ref = load_model(MODEL, backend="eager", device="cpu", dtype="float32")
    ids = ref.to_tokens(PROMPT)
    names = ("resid_pre", "attn_out", "mlp_act", "resid_post")
    reads = [f"{p}.{i}" for p in names for i in range(ref.n_layers)] + ["final_norm"]
    got = run(remote.capture([ids], reads))
    want = run(ref.capture([ids], reads))
    worst = max(float((got[a] - want[a]).abs().max()) for a in reads)
    print(f"PP=2 capture max-abs vs eager over {len(reads)} points: {worst:.2e}")
    assert worst <= TOL, worst

    last = f"resid_post.{ref.n_layers - 1}"
    vector = torch.randn(ref.d_model, generator=torch.Generator().manual_seed(3))
    spec = steer_at(f"resid_post.{ref.n_layers - 2}", Additive(vector, 8.0))  # on stage 1
    steered = run(remote.capture([ids], [last], steering=spec))[last]
    expected = run(ref.capture([ids], [last], steering=spec))[last]
    assert float((steered - expected).abs().max()) <= TOL
    assert float((steered - want[last]).abs().max()) > 100 * TOL  # negative control

    params = SamplingParams(max_new_tokens=6, stop_at_eos=False)
    want_ids = list(run(ref.generate(ids, params, steering=spec)).token_ids)
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
    assert run(remote.stats())["registered"] == 0
