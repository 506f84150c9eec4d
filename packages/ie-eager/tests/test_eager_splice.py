"""Splicing on eager (synthetic Llama, fp32 CPU): the spliced loss equals a plain HF forward with
the reconstruction written by a torch hook (1e-5), keep_error=True equals the clean run, and a
wrong dictionary (a transposed decoder) is told apart."""

from __future__ import annotations

import pytest
import torch
from eager_support import synthetic_model
from ie_core.errors import DictionaryShapeError
from ie_core.experiments.saes import SAE, from_tensors
from ie_core.experiments.splice import splice

LAYER = 1
POINT = f"resid_post.{LAYER}"
PROMPT = [[1, 17, 42, 99, 7, 23], [1, 250, 3, 64, 11, 5]]
F = 96
TOL = 1e-5


@pytest.fixture(scope="module")
def em():
    return synthetic_model("llama")


def _sae(d: int, activation: str = "relu", seed: int = 0) -> SAE:
    g = torch.Generator().manual_seed(seed)
    w = {"W_enc": torch.randn(d, F, generator=g) / d**0.5, "b_enc": torch.randn(F, generator=g) / 8,
         "W_dec": torch.randn(F, d, generator=g) / 4, "b_dec": torch.randn(d, generator=g) / 8}  # fmt: skip
    if activation == "jumprelu":
        w["threshold"] = torch.rand(F, generator=g) * 0.2
    k = 8 if activation == "topk" else None
    return from_tensors(w, address=POINT, activation=activation, k=k, b_dec_in=True)


def _reconstruct(x: torch.Tensor, w: dict, activation: str, k: int | None) -> torch.Tensor:
    """SAELens's encode then decode, from the format's definition."""
    pre = (x - w["b_dec"]) @ w["W_enc"] + w["b_enc"]
    if activation == "relu":
        acts = pre.clamp(min=0)
    elif activation == "jumprelu":
        acts = torch.where(pre > w["threshold"], pre.clamp(min=0), torch.zeros_like(pre))
    else:
        vals, ids = pre.topk(k, dim=-1)
        acts = torch.zeros_like(pre).scatter(-1, ids, vals.clamp(min=0))
    return acts @ w["W_dec"] + w["b_dec"]


def _hf_loss(em, w: dict | None, activation: str = "relu", k: int | None = None) -> torch.Tensor:
    """Per-token loss of a plain HF forward, the layer's output replaced by its reconstruction
    (a forward hook; no ie code on the way) when `w` is given."""
    layer = em.hf_model.model.layers[LAYER]

    def hook(_module, _inputs, output):
        hidden = output[0] if isinstance(output, tuple) else output
        new = _reconstruct(hidden, w, activation, k)
        return (new, *output[1:]) if isinstance(output, tuple) else new

    handle = layer.register_forward_hook(hook) if w is not None else None
    try:
        with torch.no_grad():
            logits = em.hf_model(torch.tensor(PROMPT)).logits.float()
    finally:
        if handle is not None:
            handle.remove()
    logp = torch.log_softmax(logits[:, :-1], -1)
    return -logp.gather(-1, torch.tensor(PROMPT)[:, 1:].unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("activation", ["relu", "jumprelu", "topk"])
def test_splice_equals_a_plain_forward_with_the_reconstruction(em, activation: str) -> None:
    sae = _sae(em.d_model, activation)
    got = splice(em, PROMPT, sae, keep_error=False, logits=True)
    assert got.loss.shape == (2, 5) and got.logits is not None
    want = _hf_loss(em, dict(sae.weights), activation, sae.meta.k)
    assert float((got.loss - want).abs().max()) < TOL
    assert float((got.clean_loss - _hf_loss(em, None)).abs().max()) < TOL
    # The splice matters: the reconstruction is far from the clean rows.
    assert float(got.delta.abs().max()) > 1e-2
    # Negative control: a transposed decoder (W_enc.T as W_dec) gives another loss.
    wrong = dict(sae.weights, W_dec=sae.weights["W_enc"].T.contiguous())
    assert float((_hf_loss(em, wrong, activation, sae.meta.k) - got.loss).abs().max()) > 1e-2


def test_keeping_the_error_term_is_the_clean_run(em) -> None:
    got = splice(em, PROMPT, _sae(em.d_model))
    kept = splice(em, PROMPT, _sae(em.d_model), keep_error=True)
    assert float((kept.loss - kept.clean_loss).abs().max()) < TOL
    assert torch.equal(kept.clean_loss, got.clean_loss)
    assert float((got.loss - kept.loss).abs().max()) > 1e-2  # control: without it, it differs


def test_splice_text_prompts_and_refusals(em) -> None:
    one = splice(em, "The capital of France", _sae(em.d_model))
    assert one.loss.shape[0] == 1 and one.logits is None
    with pytest.raises(DictionaryShapeError, match="wide"):
        splice(em, PROMPT, _sae(em.d_model + 2))
    with pytest.raises(ValueError, match="different lengths"):
        splice(em, [[1, 2, 3], [1, 2]], _sae(em.d_model))
