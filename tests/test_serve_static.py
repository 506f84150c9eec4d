"""`ie serve ie-synthetic/llama --backend vllm-static`: the compiled, tapped engine over HTTP.

Cost: one compiled static engine (~2-3 min on a quiet 2-core machine: start-up, torch.compile,
the self-test). The reference is eager on the same folder (an independent engine, fp32, 1e-4,
the cross-engine tolerance; in-process vllm-static is held to the same bound against eager by
ie-static's own tests). A site the server did not declare is refused with a 422 and a sentence.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import torch

pytest.importorskip("vllm")
pytest.importorskip("ie_static")

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
    log = tmp_path_factory.mktemp("serve_static") / "server.log"
    args = ["--backend", "vllm-static", "--static-points", "resid_post,mlp_out"]
    args += ["--max-model-len", "256", "--disable-uvicorn-access-log"]
    with ie_serve(MODEL, args, log) as url:
        yield url


def test_static_capture_and_steering_over_http_equal_eager(server: str) -> None:
    remote = load_model(server, backend="remote")
    assert remote.info.backend == "vllm-static"
    assert set(remote.points()) == {"resid_post", "mlp_out"}
    ref = load_model(MODEL, backend="eager", device="cpu", dtype="float32")
    ids = ref.to_tokens(PROMPT)
    declared = [f"{p}.{i}" for p in ("resid_post", "mlp_out") for i in range(ref.n_layers)]
    got, want = run(remote.capture([ids], declared)), run(ref.capture([ids], declared))
    worst = max(float((got[a] - want[a]).abs().max()) for a in declared)
    print(f"vllm-static over HTTP: capture max-abs vs eager over {len(declared)} sites {worst:.2e}")
    assert worst <= TOL, worst

    vector = torch.randn(ref.d_model, generator=torch.Generator().manual_seed(5))
    spec = steer_at("resid_post.1", Additive(vector, 8.0))
    steered = run(remote.capture([ids], ["resid_post.3"], steering=spec))["resid_post.3"]
    expected = run(ref.capture([ids], ["resid_post.3"], steering=spec))["resid_post.3"]
    print(f"steered capture max-abs vs eager {float((steered - expected).abs().max()):.2e}")
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

    # A site the engine did not declare: refused with the reload hint, not an empty tensor.
    r = httpx.post(
        f"{server}/v1/ie/capture", json={"prompts": [ids], "addresses": ["attn_out.1"]}, timeout=120
    )
    assert r.status_code == 422 and "not a declared site" in r.json()["error"]["message"], r.text
    assert run(remote.stats())["registered"] == 0
