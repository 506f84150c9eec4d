"""Dictionary features and feature steering on eager (synthetic Llama, fp32 CPU), each against
torch maths written here from the format's definition (1e-5), with negative controls."""

from __future__ import annotations

import pytest
import torch
from eager_support import synthetic_model
from ie_core.api import capture
from ie_core.errors import DictionaryShapeError, UnsupportedOperationError
from ie_core.experiments.features import (
    feature_ablate,
    feature_activations,
    feature_clamp,
    feature_steer,
)
from ie_core.experiments.saes import SAE, from_tensors
from ie_core.ops import Additive, PositionMask, steer_at

POINT = "resid_post.1"
PROMPT = [[1, 17, 42, 99, 7, 23], [1, 250, 3, 64, 11, 5]]
F = 96
TOL = 1e-5


@pytest.fixture(scope="module")
def em():
    return synthetic_model("llama")


def _sae(d: int, activation: str, seed: int = 0, **kw) -> SAE:
    g = torch.Generator().manual_seed(seed)
    w = {"W_enc": torch.randn(d, F, generator=g) / d**0.5, "b_enc": torch.randn(F, generator=g) / 8,
         "W_dec": torch.randn(F, d, generator=g) / 4, "b_dec": torch.randn(d, generator=g) / 8}  # fmt: skip
    if activation == "jumprelu":
        w["threshold"] = torch.rand(F, generator=g) * 0.2
    k = 8 if activation == "topk" else None
    return from_tensors(w, address=POINT, activation=activation, k=k, b_dec_in=True, **kw)


def reference(x: torch.Tensor, sae: SAE) -> torch.Tensor:
    """The encode from the formats' definitions (SAELens standard / JumpReLU / TopK)."""
    w = sae.weights
    pre = (x.float() - w["b_dec"]) @ w["W_enc"] + w["b_enc"]
    if sae.meta.activation == "relu":
        return pre.clamp(min=0)
    if sae.meta.activation == "jumprelu":
        return torch.where(pre > w["threshold"], pre.clamp(min=0), torch.zeros_like(pre))
    vals, ids = pre.topk(sae.meta.k, dim=-1)
    return torch.zeros_like(pre).scatter(-1, ids, vals.clamp(min=0))


@pytest.mark.parametrize("activation", ["relu", "jumprelu", "topk"])
def test_features_equal_an_independent_encode(em, activation: str) -> None:
    sae = _sae(em.d_model, activation)
    x = capture(em, PROMPT, [POINT])[POINT]
    want = reference(x, sae)
    dense = feature_activations(em, PROMPT, sae)
    assert dense.acts.shape == (2, 6, F)
    assert (dense.acts - want).abs().max() < TOL
    top = feature_activations(em, PROMPT, sae, k=5)
    assert torch.allclose(top.values, want.topk(5, dim=-1).values, atol=TOL)
    assert torch.allclose(want.gather(-1, top.ids), top.values, atol=TOL)
    # Negative control: a transposed-decoder-style mix-up (encoder read as W_dec.T) differs.
    wrong = (x - sae.weights["b_dec"]) @ sae.weights["W_dec"].T + sae.weights["b_enc"]
    assert (wrong.clamp(min=0) - want).abs().max() > 1e-2


def test_several_dictionaries_and_stats(em) -> None:
    a, b = _sae(em.d_model, "relu", 1), _sae(em.d_model, "topk", 2)
    got = feature_activations(em, PROMPT, {"a": a, "b": b}, k=3, stats=True)
    x = capture(em, PROMPT, [POINT])[POINT]
    for name, sae in (("a", a), ("b", b)):
        acts = reference(x, sae)
        assert torch.allclose(got[name].values, acts.topk(3, dim=-1).values, atol=TOL)
        x_hat = acts @ sae.weights["W_dec"] + sae.weights["b_dec"]
        fve = 1 - ((x - x_hat) ** 2).sum(-1) / ((x - x.mean(-1, keepdim=True)) ** 2).sum(-1)
        assert (got[name].fve - fve).abs().max() < 1e-4


def test_width_mismatch_is_refused(em) -> None:
    with pytest.raises(DictionaryShapeError, match="wide"):
        feature_activations(em, PROMPT, _sae(em.d_model + 1, "relu"))


def test_feature_steer_is_additive_with_the_decoder_row(em) -> None:
    sae = _sae(em.d_model, "relu")
    op = feature_steer(sae, 7, 3.0)
    a = capture(em, PROMPT, ["resid_post.2"], steering=steer_at(POINT, op))
    row = sae.weights["W_dec"][7]
    b = capture(em, PROMPT, ["resid_post.2"], steering=steer_at(POINT, Additive(row, 3.0)))
    assert float((a["resid_post.2"] - b["resid_post.2"]).abs().max()) == 0.0
    w_col = sae.weights["W_enc"][:, 7]  # negative control: the encoder column is not the row
    c = capture(em, PROMPT, ["resid_post.2"], steering=steer_at(POINT, Additive(w_col, 3.0)))
    assert float((c["resid_post.2"] - a["resid_post.2"]).abs().max()) > 1e-3


@pytest.mark.parametrize("activation", ["relu", "jumprelu"])
def test_feature_clamp_keeps_the_error_term(em, activation: str) -> None:
    sae = _sae(em.d_model, activation)
    x = capture(em, PROMPT, [POINT])[POINT]
    acts = reference(x, sae)
    f = int(acts.sum((0, 1)).argmax())  # a feature that fires
    w = sae.weights
    mask = PositionMask(positions=(2,))
    got = capture(
        em, PROMPT, [POINT], steering=steer_at(POINT, feature_clamp(sae, f, 5.0), mask=mask)
    )[POINT]
    error = x - (acts @ w["W_dec"] + w["b_dec"])
    clamped = acts.clone()
    clamped[..., f] = 5.0
    want = clamped @ w["W_dec"] + w["b_dec"] + error
    keep = torch.ones(6, dtype=torch.bool)
    keep[2] = False
    assert (got[:, keep] - want[:, keep]).abs().max() < TOL
    assert torch.equal(got[:, 2], x[:, 2])  # the masked position is left alone
    # What stays unchanged is the error of the clamped reconstruction.
    assert (
        got[:, keep] - clamped[:, keep] @ w["W_dec"] - w["b_dec"] - error[:, keep]
    ).abs().max() < TOL
    ablated = capture(em, PROMPT, [POINT], steering=steer_at(POINT, feature_ablate(sae, f)))[POINT]
    zero = acts.clone()
    zero[..., f] = 0.0
    assert (ablated - (zero @ w["W_dec"] + w["b_dec"] + error)).abs().max() < TOL
    # Negative control: ignoring b_dec in the clamp's bias breaks the identity where f fires.
    assert (ablated - x).abs().max() > 1e-3


def test_feature_clamp_refuses_topk_and_transcoders(em) -> None:
    with pytest.raises(UnsupportedOperationError, match="TopK"):
        feature_clamp(_sae(em.d_model, "topk"), 0, 1.0)


def test_streamed_features_equal_the_encode_of_the_whole_generation(em) -> None:
    """Eager reduces each step's rows where it reads them (a streamed plan's reductions): the
    concatenated steps equal the reference encode over prompt + generated[:-1]."""
    from ie_core.experiments.feature_stream import stream_features

    sae = _sae(em.d_model, "relu", seed=3)
    prompt = PROMPT[0]
    steps = list(stream_features(em, prompt, {"s": sae}, k=4, max_new_tokens=5, stop_at_eos=False))
    assert [s.features["s"].ids.shape for s in steps] == [(6, 4)] + [(1, 4)] * 4
    whole = [*prompt, *[s.chunk.token_id for s in steps][:-1]]
    x = capture(em, [whole], [POINT])[POINT][0]
    want = reference(x, sae).topk(4, dim=-1)
    values = torch.cat([s.features["s"].values for s in steps])
    assert torch.equal(torch.cat([s.features["s"].ids for s in steps]), want.indices)
    assert (values - want.values).abs().max() < TOL
    # Negative control: rows cut one position late (each step given its token's own row).
    late = reference(capture(em, [[*whole, steps[-1].chunk.token_id]], [POINT])[POINT][0, 1:], sae)
    assert (late.topk(4, dim=-1).values - values).abs().max() > 1e-2
