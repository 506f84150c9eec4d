"""vllm-static: per-step logprobs, ragged batches, gradient refusal and capture_attention.

One compiled engine (synthetic Llama, three declared read sites, max_model_len 128), started once
(~2-4 min under load: compile). vllm-static shares hooked vLLM's request path, so this checks the
path holds on the compiled engine: logprobs against a plain HF forward (1e-4, eager vs vLLM fp32),
ragged rows against its own one-prompt captures (1e-5).
"""

from __future__ import annotations

import pytest
import torch
from ie_core.errors import (
    BadPromptError,
    GradientUnavailableError,
    PointUnavailableError,
    SteeringSpecError,
    UnsupportedOperationError,
)
from ie_core.experiments.ragged import capture_ragged
from ie_core.protocol import SamplingParams
from ie_core.runner import run
from ie_core.sync import SyncModel

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

MODEL = "ie-synthetic/llama"
READS = ["resid_post.1", "resid_post.3", "attn_probs.0"]  # 3: the last layer (splice logits)
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


# --- sparse dictionaries (issue 26): the encode runs on the tap buffer ------------------------


def _dictionary(d: int, activation: str, seed: int = 0):
    from ie_core.experiments.saes import from_tensors

    g = torch.Generator().manual_seed(seed)
    f = 96
    w = {"W_enc": torch.randn(d, f, generator=g) / d**0.5, "b_enc": torch.randn(f, generator=g) / 8,
         "W_dec": torch.randn(f, d, generator=g) / 4, "b_dec": torch.randn(d, generator=g) / 8}  # fmt: skip
    if activation == "jumprelu":
        w["threshold"] = torch.rand(f, generator=g) * 0.2
    k = 8 if activation == "topk" else None
    return from_tensors(w, address="resid_post.1", activation=activation, k=k, b_dec_in=True)


def _reference(x: torch.Tensor, sae) -> torch.Tensor:
    """SAELens's encode, from its definition, on eager's captured rows."""
    w = sae.weights
    pre = (x.float() - w["b_dec"]) @ w["W_enc"] + w["b_enc"]
    if sae.meta.activation == "relu":
        return pre.clamp(min=0)
    if sae.meta.activation == "jumprelu":
        return torch.where(pre > w["threshold"], pre.clamp(min=0), torch.zeros_like(pre))
    vals, ids = pre.topk(sae.meta.k, dim=-1)
    return torch.zeros_like(pre).scatter(-1, ids, vals.clamp(min=0))


@pytest.mark.parametrize("activation", ["relu", "jumprelu", "topk"])
def test_static_features_match_an_independent_encode(pair, activation: str) -> None:
    from ie_core.experiments.features import feature_activations

    static, eager = pair
    sae = _dictionary(static.d_model, activation)
    prompts = [PROMPTS[0], [1, 3, 5, 7, 9]]
    want = _reference(run(eager.capture(prompts, ["resid_post.1"]))["resid_post.1"], sae)
    top = feature_activations(static, prompts, sae, k=6)
    assert (top.values - want.topk(6, dim=-1).values).abs().max() < 1e-4
    assert (want.gather(-1, top.ids) - top.values).abs().max() < 1e-4
    dense = feature_activations(static, prompts, sae)
    assert (dense.acts - want).abs().max() < 1e-4


def test_static_feature_clamp_relu_and_jumprelu_refusal(pair) -> None:
    from ie_core.experiments.features import feature_clamp
    from ie_core.ops import steer_at

    static, eager = pair
    if not static.policy.can_write("resid_pre.1"):
        pytest.skip("this engine declares no write at resid_pre.1")
    sae = _dictionary(static.d_model, "relu")
    steering = steer_at("resid_pre.1", feature_clamp(sae, 3, 4.0))
    got = static.capture(PROMPTS[0], ["resid_post.1"], steering=steering)["resid_post.1"]
    want = eager.capture(PROMPTS[0], ["resid_post.1"], steering=steering)["resid_post.1"]
    plain = eager.capture(PROMPTS[0], ["resid_post.1"])["resid_post.1"]
    assert (got - want).abs().max() < 1e-4
    assert (plain - want).abs().max() > 1e-3  # the clamp changed something: a control
    jump = steer_at("resid_pre.1", feature_clamp(_dictionary(static.d_model, "jumprelu"), 3, 4.0))
    with pytest.raises(UnsupportedOperationError, match="JumpReLU"):
        static.capture(PROMPTS[0], ["resid_post.1"], steering=jump)


def test_static_splice_matches_eager(pair) -> None:
    """The splice (a clean capture, then a Patch of the reconstruction) on the compiled engine."""
    from ie_core.experiments.splice import splice

    static, eager = pair
    sae = _dictionary(static.d_model, "relu", seed=4)
    prompts = [PROMPTS[0], [1, 3, 5, 7, 9]]
    got = splice(static, prompts, sae)
    want = splice(eager, prompts, sae)
    scale = float(want.clean_loss.abs().max())
    assert float((got.loss - want.loss).abs().max()) < 1e-4 * scale
    assert float((got.clean_loss - want.clean_loss).abs().max()) < 1e-4 * scale
    assert float(got.delta.abs().max()) > 1e-2 * scale  # control: the splice moves the loss
    # A prompt longer than the engine's patch rows per site is refused, naming the reload.
    with pytest.raises(SteeringSpecError, match="static_patch_rows"):
        splice(static, [list(range(1, 40))], sae)
