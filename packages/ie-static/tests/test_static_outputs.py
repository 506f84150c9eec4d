"""vllm-static: per-step logprobs, ragged batches, gradient refusal and capture_attention.

One compiled engine (synthetic Llama, two declared read sites, max_model_len 128), started once
(~2-4 min under load: compile). vllm-static shares hooked vLLM's request path, so this checks the
path holds on the compiled engine: logprobs against a plain HF forward (1e-4, eager vs vLLM fp32),
ragged rows against its own one-prompt captures (1e-5).
"""

from __future__ import annotations

import pytest
import torch
from ie_core.errors import BadPromptError, GradientUnavailableError, PointUnavailableError
from ie_core.protocol import SamplingParams, SyncModel
from ie_core.ragged import capture_ragged
from ie_core.runner import run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

MODEL = "ie-synthetic/llama"
READS = ["resid_post.1", "attn_probs.0"]
PROMPTS = [[1, 17, 42, 99, 7], [1, 250, 3], [1, 64, 11, 5, 180, 23, 9]]


@pytest.fixture(scope="module")
def pair():
    from ie_core.loading import load_model

    eager = load_model(MODEL, backend="eager")
    static = load_model(MODEL, backend="vllm-static", static_points=READS, max_model_len=128)
    yield SyncModel(static), eager
    run(static.shutdown())


def test_logprobs_match_a_plain_hf_forward(pair) -> None:
    static, eager = pair
    params = SamplingParams(max_new_tokens=5, logprobs=4, stop_at_eos=False)
    gen = static.generate(PROMPTS[0], params)
    ids = torch.tensor([PROMPTS[0] + list(gen.token_ids[:-1])])
    with torch.no_grad():
        logits = eager.hf_model(input_ids=ids, use_cache=False).logits[0].float()
    ref = torch.log_softmax(logits[len(PROMPTS[0]) - 1 :], dim=-1)
    assert gen.logprobs is not None and len(gen.logprobs) == 5
    worst = max(abs(s.logprob - float(ref[i, s.token_id])) for i, s in enumerate(gen.logprobs))
    assert worst < 1e-4, worst
    assert [list(s.top_ids) for s in gen.logprobs] == torch.topk(ref, 4).indices.tolist()
    # Negative control: one row off.
    assert abs(gen.logprobs[1].logprob - float(ref[0, gen.token_ids[1]])) > 1e-2
    chunks = list(static.generate_stream(PROMPTS[0], params))
    assert [c.logprobs.token_id for c in chunks] == list(gen.token_ids)


def test_ragged_rows_equal_one_prompt_captures(pair) -> None:
    static, _ = pair
    cache = capture_ragged(static, PROMPTS, READS)
    worst = 0.0
    for i, prompt in enumerate(PROMPTS):
        alone = static.capture([prompt], READS)
        for a in READS:
            worst = max(worst, float((cache.unpadded(a)[i] - alone[a][0]).abs().max()))
    assert worst < 1e-5, worst
    with pytest.raises(BadPromptError, match="capture_ragged"):
        static.capture(PROMPTS, READS)


def test_refusals_and_capture_attention(pair) -> None:
    static, _ = pair
    with pytest.raises(GradientUnavailableError):
        static.capture(PROMPTS[0], READS[:1], grad=True)
    probs = static.capture_attention(PROMPTS[2])
    assert [str(a) for a in probs] == ["attn_probs.0"]
    assert torch.allclose(probs["attn_probs.0"].sum(-1), torch.ones(1), atol=1e-5)
    with pytest.raises(PointUnavailableError):
        static.capture_attention(PROMPTS[2], [1])
