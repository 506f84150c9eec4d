"""Per-step logprobs from generate / generate_stream on eager, against a plain HF forward."""

from __future__ import annotations

import pytest
import torch
from eager_support import PROMPT, synthetic_model
from ie_core.errors import SamplingParamsError
from ie_core.protocol import SamplingParams
from ie_core.sync import SyncModel

TOL = 1e-5  # fp32 CPU: KV-cached decode vs one full forward
# Softcap (gemma2), logit scaling (granite), a Conv1D family (gpt2), a plain one (llama).
SLUGS = ("llama", "gemma2", "granite", "gpt2")


def reference(model, prompt: list[int], tokens: tuple[int, ...]) -> torch.Tensor:
    """log_softmax of a plain HF forward over prompt + generated[:-1]: row i predicts token i."""
    ids = torch.tensor([prompt + list(tokens[:-1])])
    with torch.no_grad():
        logits = model.hf_model(input_ids=ids, use_cache=False).logits[0].float()
    return torch.log_softmax(logits[len(prompt) - 1 :], dim=-1)


@pytest.mark.parametrize("slug", SLUGS)
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_generate_logprobs_match_a_plain_forward(slug: str, temperature: float) -> None:
    model = SyncModel(synthetic_model(slug))
    prompt = model.to_tokens(PROMPT)
    params = SamplingParams(max_new_tokens=6, temperature=temperature, seed=3, logprobs=5)
    gen = model.generate(prompt, params)
    ref = reference(model, prompt, gen.token_ids)
    assert gen.logprobs is not None and len(gen.logprobs) == len(gen.token_ids)
    worst = 0.0
    for i, step in enumerate(gen.logprobs):
        assert step.token_id == gen.token_ids[i]
        worst = max(worst, abs(step.logprob - float(ref[i, step.token_id])))
        values, ids = torch.topk(ref[i], 5)
        assert list(step.top_ids) == ids.tolist()
        assert torch.allclose(torch.tensor(step.top_logprobs), values, atol=TOL)
    assert worst < TOL
    # Negative control: temperature-scaled logprobs (a plausible wrong answer) are far off.
    scaled = torch.log_softmax(ref / 2.0, dim=-1)
    step = gen.logprobs[0]
    assert abs(step.logprob - float(scaled[0, step.token_id])) > 100 * TOL


def test_stream_logprobs_equal_generate() -> None:
    model = SyncModel(synthetic_model("llama"))
    params = SamplingParams(max_new_tokens=5, logprobs=3)
    gen = model.generate(PROMPT, params)
    chunks = list(model.generate_stream(PROMPT, params))
    assert tuple(c.logprobs for c in chunks) == gen.logprobs
    captured = model.capture_generation(PROMPT, ["resid_post.0"], params)
    assert captured.generation.logprobs == gen.logprobs


def test_logprobs_are_opt_in_and_checked() -> None:
    model = SyncModel(synthetic_model("llama"))
    assert model.generate(PROMPT, SamplingParams(max_new_tokens=2)).logprobs is None
    zero = model.generate(PROMPT, SamplingParams(max_new_tokens=2, logprobs=0)).logprobs
    assert zero is not None and all(s.top_ids == () for s in zero)
    for bad in (-1, 21, 2.0, True, "3"):
        with pytest.raises(SamplingParamsError):
            SamplingParams(logprobs=bad)  # type: ignore[arg-type]
