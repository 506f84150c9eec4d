"""Per-step logprobs, ragged batches, gradient refusals and the analysis helpers on hooked vLLM.

One engine (synthetic Mixtral: GQA attention plus an MoE router), started once for the module
(~1-2 min on a quiet machine), beside the eager model of the same weights. Tolerances: eager vs
vLLM fp32 1e-4 (the project's cross-backend bound); vLLM against itself 1e-5.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from ie_core.errors import BadPromptError, GradientUnavailableError
from ie_core.experiments.analysis import topk_experts
from ie_core.experiments.ragged import capture_ragged
from ie_core.protocol import SamplingParams
from ie_core.runner import run
from ie_core.sync import SyncModel
from vllm_support import eager, requires_vllm, start, stop

pytestmark = [pytest.mark.slow, requires_vllm]

MODEL = "ie-synthetic/mixtral"
CROSS = 1e-4
SELF = 1e-5
PROMPTS = [[1, 17, 42, 99, 7], [1, 250, 3], [1, 64, 11, 5, 180, 23, 9], [1, 8, 8]]


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[Any, Any]]:
    model = start(MODEL)
    yield SyncModel(model), SyncModel(eager(MODEL))
    stop(model)


def _reference(ref: Any, prompt: list[int], tokens: tuple[int, ...]) -> torch.Tensor:
    ids = torch.tensor([prompt + list(tokens[:-1])])
    with torch.no_grad():
        logits = ref.hf_model(input_ids=ids, use_cache=False).logits[0].float()
    return torch.log_softmax(logits[len(prompt) - 1 :], dim=-1)


def test_logprobs_match_a_plain_hf_forward(pair: tuple[Any, Any]) -> None:
    model, ref = pair
    params = SamplingParams(max_new_tokens=6, logprobs=5, stop_at_eos=False)
    gen = model.generate(PROMPTS[0], params)
    assert gen.logprobs is not None and len(gen.logprobs) == 6
    expect = _reference(ref, PROMPTS[0], gen.token_ids)
    worst = 0.0
    for i, step in enumerate(gen.logprobs):
        assert step.token_id == gen.token_ids[i] and len(step.top_ids) == 5
        worst = max(worst, abs(step.logprob - float(expect[i, step.token_id])))
        top = expect[i, list(step.top_ids)]
        worst = max(worst, float((top - torch.tensor(step.top_logprobs)).abs().max()))
        assert float(expect[i].max()) == pytest.approx(step.top_logprobs[0], abs=CROSS)
    assert worst < CROSS, worst
    # Negative control: the next row's log-softmax (an off-by-one) is far off.
    assert abs(gen.logprobs[0].logprob - float(expect[1, gen.token_ids[0]])) > 100 * CROSS
    # A sampled run reports the raw model's logprobs too (not temperature-scaled ones).
    hot = model.generate(
        PROMPTS[0], SamplingParams(max_new_tokens=3, temperature=2.0, seed=1, logprobs=2)
    )
    hot_ref = _reference(ref, PROMPTS[0], hot.token_ids)
    assert hot.logprobs is not None
    for i, step in enumerate(hot.logprobs):
        assert abs(step.logprob - float(hot_ref[i, step.token_id])) < CROSS


def test_stream_and_capture_generation_carry_the_same_logprobs(pair: tuple[Any, Any]) -> None:
    model, _ = pair
    params = SamplingParams(max_new_tokens=4, logprobs=3, stop_at_eos=False)
    gen = model.generate(PROMPTS[1], params)
    chunks = list(model.generate_stream(PROMPTS[1], params))
    assert gen.logprobs is not None
    for chunk, step in zip(chunks, gen.logprobs, strict=True):
        assert chunk.logprobs is not None and chunk.logprobs.top_ids == step.top_ids
        assert abs(chunk.logprobs.logprob - step.logprob) < SELF
    captured = model.capture_generation(PROMPTS[1], ["resid_post.0"], params)
    assert captured.generation.logprobs is not None and len(captured.generation.logprobs) == 4
    assert model.generate(PROMPTS[1], SamplingParams(max_new_tokens=2)).logprobs is None


def test_ragged_rows_equal_one_prompt_captures(pair: tuple[Any, Any]) -> None:
    model, _ = pair
    addresses = ["resid_post.1", "attn_probs.0"]
    cache = capture_ragged(model, PROMPTS, addresses)
    assert cache.lengths == (5, 3, 7, 3)
    assert cache["resid_post.1"].shape[:2] == (4, 7)
    assert cache["attn_probs.0"].shape[-2:] == (7, 7)
    worst = 0.0
    for i, prompt in enumerate(PROMPTS):
        alone = model.capture([prompt], addresses)
        for a in addresses:
            worst = max(worst, float((cache.unpadded(a)[i] - alone[a][0]).abs().max()))
        assert not cache["resid_post.1"][i, len(prompt) :].any()  # padding is zeros
    assert worst < SELF, worst
    # Negative control: a row of one prompt against another prompt's capture.
    other = model.capture([PROMPTS[3]], ["resid_post.1"])["resid_post.1"][0]
    assert float((cache.unpadded("resid_post.1")[1] - other).abs().max()) > 100 * SELF


def test_ragged_capture_is_refused_before_any_forward(pair: tuple[Any, Any]) -> None:
    model, _ = pair
    before = run(model.model.stats())
    with pytest.raises(BadPromptError, match="capture_ragged"):
        model.capture(PROMPTS[:2], ["resid_post.0"])
    assert run(model.model.stats()) == before


def test_gradients_are_refused_by_name(pair: tuple[Any, Any]) -> None:
    model, _ = pair
    with pytest.raises(GradientUnavailableError, match="backend='eager'"):
        model.capture(PROMPTS[0], ["resid_post.0"], grad=True)
    rows = torch.randn(2, model.d_model, requires_grad=True)
    with pytest.raises(GradientUnavailableError):
        run(model.model.decode_residuals(rows))
    with pytest.raises(GradientUnavailableError):
        run(model.model.decode_residuals(rows.detach(), grad=True))


def test_router_top_k_equals_eager_routing(pair: tuple[Any, Any]) -> None:
    """vLLM serves router_logits (routing itself is fused); their top-k is eager's routing."""
    model, ref = pair
    k = ref.hf_model.config.num_experts_per_tok
    logits = model.capture([PROMPTS[2]], ["router_logits.0"])["router_logits.0"]
    chosen = ref.capture([PROMPTS[2]], ["expert_indices.0"])["expert_indices.0"]
    mine = topk_experts(logits, k)
    assert torch.equal(mine.sort(-1).values, chosen.long().sort(-1).values)
    # Negative control: the bottom-k is not the routing.
    bottom = torch.topk(-logits.float(), k, dim=-1).indices
    assert not torch.equal(bottom.sort(-1).values, chosen.long().sort(-1).values)
